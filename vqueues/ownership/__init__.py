"""Which node serves which partition: the group's assignments applied to partition states, the
cluster map, replay and the self-fence.
"""
