"""The TypeScript client's error codes are the server's registry (the generated file is up to
date). Its behaviour is tested by its own suite against real nodes (clients/typescript/test)."""

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_checked_in_error_codes_match_the_registry():
    spec = importlib.util.spec_from_file_location("gen", ROOT / "scripts" / "gen_ts_codes.py")
    assert spec is not None and spec.loader is not None
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    checked_in = (ROOT / "clients" / "typescript" / "src" / "codes.ts").read_text()
    assert checked_in == gen.render(), ("run .venv/bin/python scripts/gen_ts_codes.py > "
                                        "clients/typescript/src/codes.ts")
