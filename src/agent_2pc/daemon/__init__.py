"""The daemon: one process per workspace that holds the engine in memory and serves the
library's operations on a Unix socket (docs/daemon.md).

  protocol.py     the wire format (JSON-RPC 2.0, one JSON object per line), the socket's path,
                  errors to and from the wire; light, imported by every client
  remote.py       the client side: an engine that forwards to the daemon (Agent2PC uses it when
                  a daemon serves the workspace)
  server.py       the server: the socket, the lock, peer checks, one thread per connection
  groupcommit.py  concurrent commits share the log's fsync
  reaper.py       aborts transactions past their timeout without a client call
  control.py      start (detached or in the foreground), stop, status, reap: what the CLI calls
"""
