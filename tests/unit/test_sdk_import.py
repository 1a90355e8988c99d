"""``import runplane.client`` stays light: a script, a notebook or a web service that only wants the
SDK gets none of the cloud SDKs, Docker, Powertools, moto, YAML or the CLI's own framework (httpx itself
brings rich and click along when they are installed, for its own command line)."""

import os
import subprocess
import sys


def test_importing_the_sdk_loads_nothing_heavy() -> None:
    heavy = ["boto3", "botocore", "docker", "aws_lambda_powertools", "moto", "yaml", "typer"]
    code = f"import sys, runplane.client; print(sorted({{m.split('.')[0] for m in sys.modules}} & set({heavy!r})))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=os.environ)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_the_blocking_client_loads_no_asyncio_and_the_async_one_is_still_there() -> None:
    code = (
        "import sys, runplane.client\n"
        "print('asyncio' in sys.modules)\n"
        "from runplane.client import AsyncClient, AsyncRun, AsyncSweep\n"
        "print('asyncio' in sys.modules, AsyncClient.__name__, AsyncRun.__name__, AsyncSweep.__name__)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=os.environ)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["False", "True AsyncClient AsyncRun AsyncSweep"]
