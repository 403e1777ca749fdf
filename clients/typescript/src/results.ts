// The answers' shapes: the CLI's --json objects without `ok` (docs/cli.md). Field names stay
// as agent-2pc spells them (snake_case), so that every face of agent-2pc reads the same.
// Each type names the fields the contract promises; a newer agent-2pc may add more.

export type TransactionState =
  | "active" | "preparing" | "prepared" | "committing" | "committed" | "aborting" | "aborted";

interface Open {
  [field: string]: unknown;
}

export interface TransactionRow extends Open {
  tid: string;
  state: TransactionState;
  label: string | null;
  created_at: string | number;
  ops: number | unknown[];
}

export interface StatusResult extends Open {
  transactions: TransactionRow[];
}

export interface ReadResult extends Open {
  path: string;
  sha256: string | null;
}

export interface WriteResult extends Open {
  path: string;
  op: "write";
  bytes: number;
}

export interface DeleteResult extends Open {
  path: string;
  op: "delete";
}

export interface ReplaceResult extends Open {
  path: string;
  op: "replace";
  replacements: number;
}

export interface PatchResult extends Open {
  files: string[];
}

export interface CheckResult extends Open {
  exit_code: number | null;
  passed: boolean;
  timed_out?: boolean;
  duration_ms: number;
  isolation: string;
  log: string;
  tripped?: string | null;
}

export interface ExecResult extends Open {
  exit_code: number | null;
  isolation: string;
  captured: { path: string; op: "write" | "delete" | "symlink" | "mkdir" }[];
}

export interface SavepointResult extends Open {
  name: string;
}

export interface DiffFile extends Open {
  path: string;
  status: "added" | "modified" | "deleted";
  additions: number;
  deletions: number;
}

export interface DiffResult extends Open {
  files: DiffFile[];
  diff: string;
}

export interface CommitResult extends Open {
  tid: string;
  state: "committed";
  files: string[];
}

export interface AbortResult extends Open {
  tid: string;
  state: "aborted";
}

export interface RecoverResult extends Open {
  rolled_forward: string[];
  rolled_back: string[];
  truncated_bytes: number;
}

export interface CompactResult extends Open {
  before_bytes: number;
  after_bytes: number;
}
