"""Work queues: lease consumers' settings, leasing, settling, dead letters and prefix consumers
(docs/work-queues.md).
"""
