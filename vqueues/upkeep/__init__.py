"""The node's timers: scheduled records, lease expiry, retention and snapshots."""
