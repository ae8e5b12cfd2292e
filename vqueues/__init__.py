"""vqueues: very many lightweight named queues on one Kafka data topic."""

__version__ = "0.1.0"
