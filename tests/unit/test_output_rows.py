"""OutputProcessor reads the sampled rows of a step's logits without copying them when it can."""

from __future__ import annotations

import torch

from radixrt.scheduler.output import rows_of


def test_consecutive_rows_are_a_view_and_others_a_copy_with_the_same_values():
    logits = torch.randn(6, 11)
    for rows in ([0, 1, 2, 3, 4, 5], [2, 3, 4], [5]):
        out = rows_of(logits, rows)
        assert torch.equal(out, logits[rows])
        assert out.untyped_storage().data_ptr() == logits.untyped_storage().data_ptr()
    for rows in ([0, 2, 3], [3, 2], [1, 1]):
        out = rows_of(logits, rows)
        assert torch.equal(out, logits[rows])
        assert out.untyped_storage().data_ptr() != logits.untyped_storage().data_ptr()
