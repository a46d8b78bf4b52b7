"""For tests that play a user with stock transformers only: scripts run in a fresh interpreter start with this."""

import json
import os
import subprocess
import sys
import textwrap

# Any `import vaswani_mt` in the script now raises ImportError, as on a machine without the package.
WITHOUT_VASWANI_MT = textwrap.dedent("""\
    import sys
    sys.modules["vaswani_mt"] = None  # any import of vaswani_mt now raises ImportError
    try:
        import vaswani_mt
    except ImportError:
        pass
    else:
        raise SystemExit("vaswani_mt must not be importable here")
""")


def run_without_vaswani_mt(script: str, *args: str, home) -> dict:
    """Run `script` (which starts with WITHOUT_VASWANI_MT) in a fresh offline interpreter with its own Hugging Face
    cache under `home`; returns the JSON object on its last line of output."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HOME": str(home), "HF_MODULES_CACHE": str(home / "modules")}
    result = subprocess.run([sys.executable, "-c", script, *args], capture_output=True, text=True, env=env,
                            timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])
