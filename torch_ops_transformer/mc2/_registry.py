"""Which MC2DistributedDataParallel owns a parameter, and which MC2Optimizer updates it.

Keys are the Parameter objects themselves, held weakly and compared by identity (a Tensor's `==` is
elementwise); values are weak references so the registry never keeps a model or optimizer alive.
"""
import weakref

from torch.utils.weak import WeakIdKeyDictionary

_owner_ddp = WeakIdKeyDictionary()
_optimizers_of_param = WeakIdKeyDictionary()


def set_owner_ddp(param, ddp):
    _owner_ddp[param] = weakref.ref(ddp)


def owner_ddp(param):
    ref = _owner_ddp.get(param)
    return None if ref is None else ref()


def add_optimizer(param, optimizer):
    refs = _optimizers_of_param.setdefault(param, [])
    if not any(r() is optimizer for r in refs):
        refs.append(weakref.ref(optimizer))


def optimizers_of(param):
    return [o for o in (r() for r in _optimizers_of_param.get(param, ())) if o is not None]
