"""The clusterui node agent: reads the GPUs (NVML) and the node (psutil) and reports them
to the clusterui server over one WebSocket, as shared/PROTOCOL.md describes.

A standalone package: it imports nothing from the Django project. Its layout:

    __main__.py, cli.py  `python -m agent`: the settings, the node, the client
    hook.py              `python -m agent hook`: Slurm's Prolog / Epilog
    config.py            the settings (command line, TOML file, defaults)
    node.py              Node: what the client reads and drives; build_node() for this
                         machine (agent.sim.build_simulated_node for a simulated one)
    host.py              this machine's name, boot id and Slurm state
    node_metrics.py      CPU, memory and network
    connection/          the client, the frames, the outbox, the node token
    work/                what the server asks: commands, startup scripts
    backends/            GPU readings (NVML)
    detectors/           passive health watchers (events)
    checks/              active checks (`run_check`)
    hygiene/             node hygiene on Slurm nodes
    sim/                 the simulation (--simulate, the demo fleet); only the entry
                         points import it
    data/                data the agent loads at run time: NVIDIA's Xid catalog, the real
                         H200 trace the simulation replays
"""

__version__ = "1.0.0"
