"""Pure core: records, states, transitions, patches and diffs — no I/O."""
