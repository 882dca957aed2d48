"""One rank of the MC2Optimizer / MC2DistributedDataParallel tests (launched by test_training.py).

`python -m test.mc2.training_worker <scenario>...` (from the repository root) with RANK, WORLD_SIZE, MASTER_ADDR,
MASTER_PORT set. Scenario 'equivalence' trains every candidate and its reference (torch DDP + torch optimizer) for a few steps on the same
per-rank data and prints one `RESULT {json}` line per case (misuse cases report the error every rank saw);
'rank_raises_ddp' / 'rank_raises_local' then make rank 1 fail, and every rank must exit with an error (no hang).
"""
import contextlib
import copy
import datetime
import json
import sys

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from torch_ops_transformer import MC2DistributedDataParallel, MC2Optimizer

STEPS = 5
BUCKET_MB = 0.002  # ~500 fp32 gradients per bucket: several buckets even for the tiny test models


class Net(nn.Module):
    """An MLP; `extra` is used only on odd ranks (locally unused), `dead` on no rank, `frozen` never trains."""

    def __init__(self, with_unused=False):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(12, 24), nn.Tanh(), nn.Linear(24, 24), nn.Tanh(), nn.Linear(24, 6))
        self.with_unused = with_unused
        if with_unused:
            self.extra = nn.Linear(12, 6)
            self.dead = nn.Linear(12, 6)
            self.frozen = nn.Linear(12, 6)
            self.frozen.requires_grad_(False)

    def forward(self, x):
        y = self.body(x)
        if self.with_unused:
            y = y + self.frozen(x)
            if dist.get_rank() % 2 == 1:
                y = y + self.extra(x)
        return y


def batch(step, micro=0):
    g = torch.Generator().manual_seed(1000 * dist.get_rank() + 10 * step + micro)
    return torch.randn(8, 12, generator=g), torch.randn(8, 6, generator=g)


def loss_of(model, step, micro=0):
    x, y = batch(step, micro)
    return nn.functional.mse_loss(model(x), y)


def train(model, optimizer, steps=STEPS, accumulate=1, scheduler=None, start=0, moved_in_backward=None):
    """The DDP training loop; `moved_in_backward` (a list) records per step whether backward itself updated params."""
    for step in range(start, start + steps):
        optimizer.zero_grad()
        for micro in range(accumulate - 1):
            with model.no_sync():
                loss_of(model, step, micro).backward()
        before = params_of(model)
        loss_of(model, step, accumulate - 1).backward()
        if moved_in_backward is not None:
            moved_in_backward.append(any(not torch.equal(a, b) for a, b in zip(before, params_of(model))))
        optimizer.step()
        if scheduler is not None:
            scheduler.step()
    return model


def make_optim(kind):
    if kind == "sgd":
        return torch.optim.SGD, dict(lr=0.05, momentum=0.9, weight_decay=0.01)
    return torch.optim.AdamW, dict(lr=0.01, weight_decay=0.05)


def params_of(model):
    module = model.module if isinstance(model, DDP) else model
    return [p.detach().clone() for p in module.parameters()]


def state_of(model):
    """Parameters, then gradients (a gradient left None is recorded as an empty tensor)."""
    module = model.module if isinstance(model, DDP) else model
    grads = [torch.empty(0) if p.grad is None else p.grad.detach().clone() for p in module.parameters()]
    return params_of(model) + grads


def compare(name, got, want):
    """Parameters and gradients after training vs the reference's; `bitwise` means every tensor is equal."""
    assert len(got) == len(want) and all(a.shape == b.shape for a, b in zip(got, want)), name
    diffs = [(a.double() - b.double()).abs().max().item() for a, b in zip(got, want) if a.numel()]
    bitwise = all(torch.equal(a, b) for a, b in zip(got, want))
    return dict(name=name, bitwise=bitwise, max_diff=max(diffs))


_references = {}


def reference(base, kind, find_unused=False, accumulate=1, schedule=False):
    """Plain torch DDP + the torch optimizer: what every candidate must reproduce (memoised per setting)."""
    key = (id(base), kind, find_unused, accumulate, schedule)
    if key not in _references:
        _references[key] = _train_reference(base, kind, find_unused, accumulate, schedule)
    return _references[key]


def _train_reference(base, kind, find_unused, accumulate, schedule):
    model = DDP(copy.deepcopy(base), bucket_cap_mb=BUCKET_MB, find_unused_parameters=find_unused)
    cls, kw = make_optim(kind)
    optimizer = cls(model.parameters(), **kw)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, 2, gamma=0.5) if schedule else None
    return state_of(train(model, optimizer, accumulate=accumulate, scheduler=scheduler))


class LocalModel(nn.Module):
    """A non-DDP model with the `no_sync` the training loop calls (MC2Optimizer alone reduces in step())."""

    def __init__(self, module):
        super().__init__()
        self.module = module

    def forward(self, x):
        return self.module(x)

    def no_sync(self):
        return contextlib.nullcontext()


def case_mc2_optimizer(base, kind, policy, with_unused=False):
    cls, kw = make_optim(kind)
    model = LocalModel(copy.deepcopy(base))
    optimizer = MC2Optimizer(model.parameters(), comm_policy=policy, optimizer_class=cls, bucket_cap_mb=BUCKET_MB, **kw)
    got = state_of(train(model, optimizer).module)
    return compare(f"mc2opt-{policy}-{kind}{'-unused' if with_unused else ''}", got,
                   reference(base, kind, find_unused=with_unused))


def case_mc2_ddp(base, kind, optimizer_type, find_unused=False, accumulate=1, schedule=False, tag=""):
    model = MC2DistributedDataParallel(copy.deepcopy(base), device_ids=[0], bucket_cap_mb=BUCKET_MB,
                                       find_unused_parameters=find_unused)
    cls, kw = make_optim(kind)
    if optimizer_type == "mc2":
        optimizer = MC2Optimizer(model.parameters(), optimizer_class=cls, **kw)
    else:
        optimizer = cls(model.parameters(), **kw)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, 2, gamma=0.5) if schedule else None
    moved = []
    got = state_of(train(model, optimizer, accumulate=accumulate, scheduler=scheduler, moved_in_backward=moved))
    want = reference(base, kind, find_unused=find_unused, accumulate=accumulate, schedule=schedule)
    return compare(f"mc2ddp-{optimizer_type}-{kind}{tag}", got, want) | dict(moved_in_backward=moved)


def case_no_communication(base):
    """comm_policy='none' is the plain torch optimizer on local gradients (no all-reduce at all)."""
    cls, kw = make_optim("adamw")
    model = LocalModel(copy.deepcopy(base))
    got = state_of(train(model, MC2Optimizer(model.parameters(), comm_policy="none", **kw)).module)
    plain = LocalModel(copy.deepcopy(base))
    return compare("mc2opt-none-adamw", got, state_of(train(plain, cls(plain.parameters(), **kw)).module))


def case_state_dict_round_trip(base):
    """3 steps, save, rebuild model + optimizer from the saved state, 2 more steps == 5 uninterrupted steps."""
    cls, kw = make_optim("adamw")
    first = MC2DistributedDataParallel(copy.deepcopy(base), bucket_cap_mb=BUCKET_MB)
    opt1 = MC2Optimizer(first.parameters(), optimizer_class=cls, **kw)
    train(first, opt1, steps=3)
    saved_model, saved_opt = copy.deepcopy(first.module.state_dict()), copy.deepcopy(opt1.state_dict())
    plain = cls(first.parameters(), **kw)
    plain.load_state_dict(saved_opt)  # the format is optimizer_class's own
    assert plain.state_dict()["param_groups"] == saved_opt["param_groups"]
    module = copy.deepcopy(base)
    module.load_state_dict(saved_model)
    second = MC2DistributedDataParallel(module, bucket_cap_mb=BUCKET_MB)
    opt2 = MC2Optimizer(second.parameters(), optimizer_class=cls, **kw)
    opt2.load_state_dict(saved_opt)
    train(second, opt2, steps=2, start=3)
    return compare("state-dict-round-trip", state_of(second), reference(base, "adamw"))


def case_two_backwards_without_step(base):
    """Misuse: the update runs inside backward, so a 2nd synced backward before step() must fail loudly."""
    model = MC2DistributedDataParallel(copy.deepcopy(base), bucket_cap_mb=BUCKET_MB)
    optimizer = MC2Optimizer(model.parameters(), lr=0.01)
    optimizer.zero_grad()
    loss_of(model, 0).backward()
    try:
        loss_of(model, 1).backward()
    except RuntimeError as e:
        return dict(name="two-backwards-error", error=str(e)[:400])
    return dict(name="two-backwards-error", error=None)


class MixedDtypeNet(nn.Module):
    """fp32 and fp64 parameters side by side: separate buckets per dtype, in DDP and in MC2Optimizer."""

    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(12, 16), nn.Tanh(), nn.Linear(16, 6))
        self.head64 = nn.Linear(12, 6).double()

    def forward(self, x):
        return self.body(x) + self.head64(x.double()).float()


def equivalence():
    torch.manual_seed(0)
    base, base_unused, base_mixed = Net(), Net(with_unused=True), MixedDtypeNet()
    results = []
    for kind in ("sgd", "adamw"):
        for policy in ("overlap", "sequential"):
            results.append(case_mc2_optimizer(base, kind, policy))
    results.append(case_mc2_optimizer(base_unused, "adamw", "overlap", with_unused=True))
    results.append(case_mc2_optimizer(base_mixed, "adamw", "overlap") | dict(name="mc2opt-overlap-adamw-mixed-dtype"))
    results.append(case_no_communication(base))
    for kind in ("sgd", "adamw"):
        results.append(case_mc2_ddp(base, kind, "mc2"))
    results.append(case_mc2_ddp(base, "adamw", "plain"))
    results.append(case_mc2_ddp(base_unused, "adamw", "mc2", find_unused=True, tag="-unused"))
    results.append(case_mc2_ddp(base_unused, "sgd", "mc2", find_unused=True, tag="-unused"))
    results.append(case_mc2_ddp(base_mixed, "adamw", "mc2", tag="-mixed-dtype"))
    results.append(case_mc2_ddp(base, "adamw", "mc2", accumulate=2, tag="-no_sync"))
    results.append(case_mc2_ddp(base, "sgd", "mc2", schedule=True, tag="-steplr"))
    results.append(case_state_dict_round_trip(base))
    results.append(case_two_backwards_without_step(base))
    results.append(case_mismatched_models())
    for r in results:
        print("RESULT " + json.dumps(r), flush=True)


def case_mismatched_models():
    """Rank 0 builds a different model: MC2Optimizer's layout check must fail on every rank (no hang)."""
    model = nn.Linear(12, 7 if dist.get_rank() == 0 else 6)
    optimizer = MC2Optimizer(model.parameters(), lr=0.01)
    model(torch.randn(2, 12)).sum().backward()
    try:
        optimizer.step()
    except RuntimeError as e:
        return dict(name="mismatched-models-error", error=str(e)[:400])
    return dict(name="mismatched-models-error", error=None)


def rank_raises(wrapper):
    """Rank 1 fails before its step; the others are then inside a collective and must error, not hang."""
    torch.manual_seed(0)
    base = Net()
    if wrapper == "ddp":
        model = MC2DistributedDataParallel(base, bucket_cap_mb=BUCKET_MB)
    else:
        model = LocalModel(base)
    optimizer = MC2Optimizer(model.parameters(), lr=0.01, bucket_cap_mb=BUCKET_MB)
    train(model, optimizer, steps=1)
    if dist.get_rank() == 1:
        raise RuntimeError("rank 1 fails on purpose")
    train(model, optimizer, steps=1, start=1)
    print("UNREACHABLE: the step after a peer failed returned", flush=True)


def main():
    """argv: scenarios run in order in one process group: 'equivalence', then optionally 'rank_raises_ddp' or
    'rank_raises_local' (which ends the job: every rank must exit with an error)."""
    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=30))
    for scenario in sys.argv[1:]:
        if scenario == "equivalence":
            equivalence()
        elif scenario.startswith("rank_raises_"):
            rank_raises(scenario.removeprefix("rank_raises_"))
        else:
            raise ValueError(f"unknown scenario {scenario!r}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
