"""TorchTitan's own Trainer driving Zephon: the CPU patch (``cpu``), the logged entry point (``train``), the
launcher (``launch``) and the elastic-resume experiment (``elastic``). docs/distributed.md#torchtitan."""
