"""train.clip_in_optimizer on CUDA: torch's fused AdamW kernel divides by the clip divisor as the Trainer's clipping
multiplies (CPU's fused kernel, which the CPU tests use, is another implementation of the same contract).

Skipped, with the reason, where there is no CUDA GPU (CI has none).
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from sparsebert.trainer.clipping import clip_divisor, total_norm

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def _train(clip: str, max_norm: float = 0.05) -> torch.Tensor:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(256, 1024), nn.GELU(), nn.Linear(1024, 64)).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)
    g = torch.Generator(device="cuda").manual_seed(0)
    for _ in range(8):
        x = torch.randn(512, 256, device="cuda", generator=g)
        model(x).square().sum().backward()
        if clip == "trainer":
            norm = nn.utils.clip_grad_norm_(model.parameters(), max_norm)
        else:
            norm = total_norm([p.grad for p in model.parameters()])
            if clip == "in_optimizer":
                opt.grad_scale = clip_divisor(norm, max_norm)
        assert norm.item() > 10 * max_norm  # every step is clipped
        opt.step()
        if clip == "in_optimizer":
            # the kernel wrote the divided gradients back, as clipping leaves them
            torch.testing.assert_close(total_norm([p.grad for p in model.parameters()]).item(), max_norm, rtol=1e-4,
                                       atol=0)
            del opt.grad_scale
        opt.zero_grad()
    return torch.cat([p.detach().flatten() for p in model.parameters()])


def test_fused_adamw_divides_by_the_clip_divisor_as_clipping_multiplies():
    ours, theirs, unclipped = _train("in_optimizer"), _train("trainer"), _train("none")
    torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-6)
    assert (ours - unclipped).abs().max() > 100 * (ours - theirs).abs().max()
