"""The queue service: reads, enqueues (keyed, multi-queue), acks, deletion, quotas."""
