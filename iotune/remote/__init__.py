"""Running iotune's agents on other nodes: which nodes (hosts), plain ssh
(ssh) and Slurm's srun (slurm) behind one Transport, for the multi-node
trace and sweep.
"""
