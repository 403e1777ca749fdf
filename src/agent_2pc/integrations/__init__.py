"""agent-2pc inside the agent frameworks people already run, one module per framework, each
behind an optional extra (docs/integrations.md):

- ``agent_2pc.integrations.minisweagent``: an environment for mini-swe-agent whose commands run
  in one transaction's staged view; the submission commits, a failure aborts;
- ``agent_2pc.integrations.openai_agents``: tools for the OpenAI Agents SDK, and a wrapper that
  fences a side-effecting function tool;
- ``agent_2pc.integrations.pydantic_ai``: a toolset with the transaction's tools, and a wrapper
  toolset that fences another toolset's tools that are not read-only;
- ``agent_2pc.integrations.langgraph``: a LangChain tool wrapper that fences, and a helper that
  makes a graph's file effects one transaction.

Nothing here is imported by the CLI; each module imports its framework when it is imported.
"""
