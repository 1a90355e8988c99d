"""The examples and the longer descriptions the OpenAPI document shows with the operations."""

from __future__ import annotations

RUN_EXAMPLES = {
    "train": {
        "summary": "sizes and the time limit as text",
        "value": {
            "command": "python train.py --epochs 10",
            "image": "python:3.12",
            "name": "train",
            "queue": "default",
            "resources": {"cpus": 2, "gpus": 0, "memory": "4g", "disk": "10g", "time": "2h"},
            "env": {"EPOCHS": "10"},
            "inputs": {"data": "s3://datasets/mnist/"},
            "labels": {"project": "vision", "exp": "lr-3"},
        },
    },
    "minimal": {"summary": "a command alone: the default pool, its image, its limits", "value": {"command": "echo hi"}},
    "upload": {
        "summary": "a directory of yours uploaded (POST /v1/uploads), run where it is unpacked",
        "value": {
            "command": "python3 train.py",
            "image": "python:3.12",
            "inputs": {"code": "upload:9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"},
            "workdir": "/inputs/code",
        },
    },
    "after": {
        "summary": "waits for a run's outputs (queued, holding no worker, until that run has succeeded)",
        "value": {
            "command": "python evaluate.py /inputs/model",
            "inputs": {"model": "run:r-4f9c2a7be0d14d3aa1c05e21/checkpoints"},
            "after": ["r-8d1e0b5c9a7f4e2b8c6d3a10"],
        },
    },
    "checkpoint": {
        "summary": "checkpoints every 10 minutes and on a stop; exit 85 starts it again in the same attempt",
        "value": {
            "command": "exec python train.py --resume-from $RUNPLANE_CHECKPOINT_DIR",
            "checkpoint": {"interval": "10m", "signal": "SIGUSR1", "grace": "60s", "exit_code": 85},
        },
    },
    "fallback": {
        "summary": "on spot GPUs, moved to on-demand ones when not started within 20 minutes or preempted twice",
        "value": {
            "command": "exec python train.py",
            "queue": ["gpu-spot", "gpu-ondemand"],
            "resources": {"gpus": 1},
            "fallback_after": "20m",
            "fallback_after_preemptions": 2,
            "checkpoint": {"interval": "10m"},
        },
    },
    "from checkpoint": {
        "summary": "starts from another run's newest checkpoint (a run of yours), until it has one of its own",
        "value": {"command": "exec python finetune.py", "from_checkpoint": "r-4f9c2a7be0d14d3aa1c05e21"},
    },
}


PRIORITY_EXAMPLES = {
    "urgent": {"summary": "ahead of every waiting run of priority 79 or less", "value": {"priority": 80}},
    "later": {"summary": "behind the others: a run that can wait", "value": {"priority": 10}},
}


KEEP_EXAMPLES = {
    "keep": {"summary": "keep its outputs, logs and record until it is let go", "value": {"keep": True}},
    "let go": {"summary": "its pool's retention applies again, from when it ended", "value": {"keep": False}},
}


PRIORITY_403 = (
    "the token lacks the scope this needs, or a caller who is not an admin asks a priority above the "
    "pool's max_user_priority"
)


RELEASE_403 = (
    "the token lacks the scope this needs, the sweep's owner is no longer in the group it is charged to or "
    "allowed its inputs, or a caller who is not an admin would release members at a priority above the "
    "pool's max_user_priority"
)


USER_EXAMPLES = {
    "default": {"summary": "runs naming no group are charged to vision", "value": {"default_group": "vision"}},
    "none": {"summary": "no default: a run must name its group", "value": {"default_group": None}},
}


TOKEN_EXAMPLES = {
    "user": {
        "summary": "a user of the group vision for 90 days",
        "value": {"user": "alice", "groups": ["vision"], "scopes": ["runs:read", "runs:write"], "expires_in": "90d"},
    }
}


QUOTA_EXAMPLES = {
    "caps": {
        "summary": "at most 4 runs and 2 GPUs at once, 200 GPU-hours a month",
        "value": {"max_running": 4, "max_gpus": 2, "gpu_hours": 200, "period": "month"},
    },
    "daily": {"summary": "100 cpu-hours a day", "value": {"cpu_hours": 100, "period": "day"}},
    "count": {"summary": "no limit: only count use", "value": {}},
}


SWEEP_EXAMPLES = {
    "grid": {
        "summary": "3 learning rates times 2 seeds, at most 2 at once",
        "value": {
            "name": "lr-search",
            "run": {"command": "python train.py --lr $LR --seed $SEED", "resources": {"gpus": 1, "time": "2h"}},
            "parameters": {"LR": [0.1, 0.01, 0.001], "SEED": [1, 2]},
            "max_parallel": 2,
        },
    },
    "repeat": {
        "summary": "the same run 100 times (RUNPLANE_SWEEP_INDEX tells them apart)",
        "value": {"run": {"command": "python eval.py --shard $RUNPLANE_SWEEP_INDEX"}, "count": 100},
    },
}


SECRET_EXAMPLES = {
    "token": {"summary": "an API key", "value": {"value": "hf_0123456789abcdefghijklmnopqrstuvwxyz"}},
    "registry": {
        "summary": "a registry login, for image_pull_secret",
        "value": {"value": '{"username": "ci", "password": "s3cret-registry-password"}'},
    },
}

UPLOAD_EXAMPLES = {
    "archive": {
        "summary": "an archive of 48213 bytes, by its SHA-256 and MD5",
        "value": {
            "sha256": "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08",
            "size": 48213,
            "md5": "1B2M2Y8AsgTpgAmY7PhCfg==",
        },
    }
}

SESSION_EXAMPLES = {
    "exec": {
        "summary": "a command, its input from the client (runplane exec -i RUN -- sh -c ...)",
        "value": {"kind": "exec", "command": ["sh", "-c", "echo hi; exit 3"], "stdin": True},
    },
    "shell": {
        "summary": "the image's shell, with a terminal of this size (runplane shell RUN)",
        "value": {"kind": "shell", "term": "xterm-256color", "rows": 40, "cols": 120},
    },
    "port_forward": {
        "summary": "connections to 127.0.0.1:8000 inside the run (runplane port-forward RUN 18000:8000)",
        "value": {"kind": "port_forward", "port": 8000},
    },
}
