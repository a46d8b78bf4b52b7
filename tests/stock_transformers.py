"""For tests that play a user with stock transformers only: scripts run in a fresh interpreter start with this."""

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
