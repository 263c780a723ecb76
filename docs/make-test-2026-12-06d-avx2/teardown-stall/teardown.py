"""test_budget_runs' module fixture outside pytest: train it, then drop the Trainer (`del`), or its attributes one
at a time with a gc.collect() after each (`parts`), and print how long that took. Run from the repository root:
`python docs/make-test-2026-12-06d-avx2/teardown-stall/teardown.py del|parts`."""

import faulthandler
import gc
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, os.getcwd())
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ["NMT_DATA_CACHE"] = tempfile.mkdtemp()


def main(what: str) -> None:
    import tests.conftest  # noqa: F401  (the suite's environment)
    from tests.nmt import test_budget_runs as module
    from tests.run_fixture import write_corpus

    faulthandler.dump_traceback_later(int(os.environ.get("DUMP", "9999")), repeat=True, file=sys.stderr)
    tmp = Path(tempfile.mkdtemp())
    config = module.budget_config.__wrapped__(write_corpus(tmp / "corpus"))
    trainer, result, _ = module.train_in_process(config, tmp / "run", module.StepClock())
    print("trained", result.status, flush=True)
    start = time.perf_counter()
    if what == "parts":
        for name in list(vars(trainer)):
            part = time.perf_counter()
            setattr(trainer, name, None)
            gc.collect()
            if time.perf_counter() - part > 0.2:
                print(f"  {name}: {time.perf_counter() - part:.2f}s", flush=True)
    del trainer, result
    gc.collect()
    print(f"teardown {what}: {time.perf_counter() - start:.2f}s", flush=True)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "del")
