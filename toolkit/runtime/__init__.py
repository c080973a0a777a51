"""Machinery shared by the stages that run things (launch and validate), so neither imports the other:

    slurm    every Slurm client call: bounded commands, sbatch, job state, cancel-and-wait, node lists
    rundir   run directories (created exclusively), the runs root, atomic writes, the job's phase files
    procs    process groups a run owns: start, liveness, signal, terminate (bounded), never a pattern match
"""
