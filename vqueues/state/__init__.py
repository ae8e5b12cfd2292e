"""A partition's state: the parts PartitionState coordinates, each one kind of state, rebuilt from
the data and offset topics (no Kafka client, no I/O).
"""
