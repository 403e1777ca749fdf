"""Crash-state exploration (issue 12): every state a machine crash may leave, checked.

trace.py     strace a real agent-2pc process; parse its system calls
fsmodel.py   the calls as operations on inodes; apply any subset of them to a tree
models.py    persistence models (ext4 data=ordered, weakest POSIX) and their crash states
check.py     run the CLI on a state; read what the log and the fence say
explore.py   record a workload, generate and check its states, the invariants
workloads.py the workloads
__main__.py  ``python -m crashsim`` (see its docstring)
"""
