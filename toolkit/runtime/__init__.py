"""Machinery shared by the stages that run things (launch and validate), so neither imports the other:

    slurm    every Slurm client call: bounded commands, sbatch, job state, cancel-and-wait, node lists
    rundir   run directories (created exclusively), the runs root, atomic writes, the job's phase files
    procs    the processes a run owns (its session and run id): start, liveness, signal, terminate (bounded)
"""
