"""The work the server sends a node, beside the samples and events:

    commands.py   `command` frames: the reboot command, CommandSet (a node's handlers
                  as one); node hygiene's cleanup and reconfigure are agent/hygiene's
    scripts.py    the startup scripts of `config` frames: run at boot, and by the Slurm
                  hook (agent/hook.py) at job start and end; their results spooled"""
