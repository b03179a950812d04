"""How an Engine starts its backend: the scheduler side (child processes, or threads of this
process) and the tokenizer, which this process loads while a child loads the model.

Torch-free at import, as engine.py: the loaders and the in-process scheduler are imported when
called (tests/server/test_frontend_imports.py)."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from radixrt.server_args import ServerArgs

logger = logging.getLogger("radixrt.engine")

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from radixrt.ipc.processes import SchedulerHandle


def start_backend(
    args: ServerArgs,
    in_process: bool,
) -> tuple[SchedulerHandle, PreTrainedTokenizerBase | None]:
    """The handle of a ready scheduler side, and the tokenizer (None with
    skip_tokenizer_init). FileNotFoundError for a model path that does not exist; a child
    started before the tokenizer failed to load is stopped."""
    from radixrt.frontend.chat_template_loader import load_chat_template
    from radixrt.ipc.processes import abandon, start_process
    from radixrt.loader.default_model import default_model_path
    from radixrt.loader.supported import refuse_unsupported
    from radixrt.loader.tokenizer import hand_over_tokenizer, load_tokenizer

    path = args.model_path or default_model_path()
    if not os.path.exists(path):
        raise FileNotFoundError(f"model_path {path!r} does not exist")
    refuse_unsupported(path)  # before a tokenizer loads or a process starts
    # The child process loads the model while this one loads the tokenizer.
    wait_ready: Callable[[], SchedulerHandle] | None = None
    tokenizer_dir: str | None = None
    if not in_process:
        wait_ready, tokenizer_dir = start_process(args)
    tokenizer = None
    try:
        if not args.skip_tokenizer_init:
            start = time.monotonic()
            tokenizer = load_tokenizer(path, args.tokenizer_path)
            if args.chat_template is not None:  # every renderer reads this attribute
                tokenizer.chat_template = load_chat_template(args.chat_template)
            logger.info("tokenizer loaded in %.2f s", time.monotonic() - start)
            if tokenizer_dir is not None:
                hand_over_tokenizer(tokenizer, tokenizer_dir)
    except BaseException:
        if wait_ready is not None:
            abandon(wait_ready)
        raise
    if wait_ready is None:  # in_process
        from radixrt.frontend.in_process import start_thread

        return start_thread(args, tokenizer), tokenizer
    return wait_ready(), tokenizer
