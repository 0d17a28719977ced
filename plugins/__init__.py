"""RMS adapters (Slurm, Torque/OpenPBS, OAR) that observe the cluster into a ClusterView and
carry out decisions, plus the files an operator installs into each RMS (submit filters,
hooks, prolog/epilog).
"""
