"""Defines the `torchvision::nms` / `qnms` operator schemas before torchvision is imported.

Why it exists: the torchvision 0.28.0 wheel pip installs on this machine is the +cu130 build; its
compiled ops (`_C.so`) need libtorch_cuda and do not load on the CPU torch, and
torchvision/_meta_registrations.py then fails at import on register_fake("torchvision::nms")
("operator torchvision::nms does not exist"). SGLang's HTTP server imports torchvision (for
multimodal models we never serve), so the server cannot start without it.

Defining the two schemas (no kernels) lets torchvision's pure-Python parts import; calling the ops
still fails, loudly. Loaded by moa_pd_torchvision_ops.pth at interpreter start, because SGLang
spawns its scheduler and detokenizer as fresh interpreters; it imports torch only when something
imports torchvision.
"""

import sys

_KEEP = []  # a torch.library.Library must stay alive, or its schemas are dropped again


class _DefineSchemasFirst:
    def find_spec(self, name, path=None, target=None):
        if name != "torchvision":
            return
        sys.meta_path.remove(self)
        import torch

        lib = torch.library.Library("torchvision", "FRAGMENT")
        for op in ("nms", "qnms"):
            try:
                lib.define(f"{op}(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
            except RuntimeError:
                pass  # already defined: a torchvision build whose ops do load
        _KEEP.append(lib)
        return  # the normal finders import torchvision itself


sys.meta_path.insert(0, _DefineSchemasFirst())
