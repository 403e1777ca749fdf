"""Storage: owns every byte on disk and every fsync (log, blobs, locks, workspace layout)."""
