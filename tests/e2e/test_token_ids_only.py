"""A model folder without a tokenizer serves token ids with skip_tokenizer_init=True."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

import radixrt


@pytest.fixture(scope="module")
def bare_model_dir(tiny_model_dir, tmp_path_factory):
    src = Path(tiny_model_dir("qwen2"))
    dst = tmp_path_factory.mktemp("bare")
    for f in src.iterdir():
        if f.name == "config.json" or f.suffix == ".safetensors":
            shutil.copy(f, dst / f.name)
    return str(dst)


def test_token_ids_only(bare_model_dir):
    with pytest.raises(ValueError, match="skip_tokenizer_init"):
        radixrt.Engine(model_path=bare_model_dir, dtype="float32")
    with radixrt.Engine(
        model_path=bare_model_dir, dtype="float32", skip_tokenizer_init=True
    ) as engine:
        out = engine.generate(
            input_ids=[[5, 6, 7], [8, 9]], sampling_params={"max_new_tokens": 4, "ignore_eos": True}
        )
        assert [len(o["output_ids"]) for o in out] == [4, 4]
        assert out[0]["text"] == ""
        with pytest.raises(ValueError, match="input_ids"):
            engine.generate("text needs a tokenizer")
        with pytest.raises(ValueError, match="stop"):
            engine.generate(input_ids=[1, 2], sampling_params={"stop": "x"})


def test_missing_model_path_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="does-not-exist"):
        radixrt.Engine(model_path=str(tmp_path / "does-not-exist"))


def test_child_scheduler_death_is_an_error_not_a_hang(tiny_model_dir):
    import os
    import signal
    import time

    from radixrt.errors import SchedulerDied

    engine = radixrt.Engine(model_path=tiny_model_dir("llama"), dtype="float32")
    try:
        assert engine.info.pid != os.getpid()
        assert engine.generate(input_ids=[1, 2, 3], sampling_params={"max_new_tokens": 2})
        os.kill(engine.info.pid, signal.SIGKILL)
        start = time.monotonic()
        with pytest.raises(SchedulerDied):
            engine.generate(
                input_ids=[1, 2, 3], sampling_params={"max_new_tokens": 200, "ignore_eos": True}
            )
        assert time.monotonic() - start < 10
    finally:
        engine.shutdown()


def test_shutdown_ends_the_child_process(tiny_model_dir):
    import os

    engine = radixrt.Engine(model_path=tiny_model_dir("llama"), dtype="float32")
    pid = engine.info.pid
    engine.shutdown()
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)  # reaped: no such process


def test_scheduler_exits_when_its_frontend_is_killed(tiny_model_dir):
    import os
    import signal
    import subprocess
    import sys
    import time

    code = (
        "import sys, time, radixrt; e = radixrt.Engine(model_path=sys.argv[1], "
        "dtype='float32'); print(e.info.pid, flush=True); time.sleep(120)"
    )
    front = subprocess.Popen(
        [sys.executable, "-c", code, tiny_model_dir("llama")], stdout=subprocess.PIPE, text=True
    )
    child = int(front.stdout.readline())
    os.kill(front.pid, signal.SIGKILL)
    front.wait()
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        try:
            os.kill(child, 0)
        except ProcessLookupError:
            return
        time.sleep(0.2)
    os.kill(child, signal.SIGKILL)
    pytest.fail("the scheduler process outlived its frontend")
