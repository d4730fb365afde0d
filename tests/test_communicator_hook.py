"""The platform's communicator hook: kog's communicator only on a kog server with the `collective` option on.

vLLM asks `current_platform.get_device_communicator_cls()` once per process group (GroupCoordinator.__init__) and
resolves the qualified name; every other server, an unparsable kog config included, keeps vLLM's CudaCommunicator.
"""

from __future__ import annotations

import types

import pytest

pytest.importorskip("vllm")

from vllm_cli_helpers import import_kog_platform  # noqa: E402

from kog_backend.collective import COMMUNICATOR_QUALNAME  # noqa: E402
from kog_backend.config import WORKER_CLS  # noqa: E402


@pytest.fixture
def platform(monkeypatch, request):
    return import_kog_platform(monkeypatch, request)


def _config(worker_cls, kog_options):
    additional = {} if kog_options is None else {"kog": kog_options}
    return types.SimpleNamespace(parallel_config=types.SimpleNamespace(worker_cls=worker_cls),
                                 additional_config=additional)


@pytest.mark.parametrize("worker_cls, options, expected", [
    (WORKER_CLS, {"collective": True}, COMMUNICATOR_QUALNAME),
    (WORKER_CLS, {"collective": "true"}, COMMUNICATOR_QUALNAME),
    (WORKER_CLS, {}, None),                                         # off by default
    (WORKER_CLS, None, None),
    (WORKER_CLS, {"collective": True, "enabled": False}, None),     # --backend stock
    (WORKER_CLS, {"collective": True, "no_such_option": 1}, None),  # unparsable: the worker reports it
    ("auto", {"collective": True}, None),                           # not kog's worker
])
def test_communicator_qualname(platform, worker_cls, options, expected):
    assert platform.communicator_qualname(_config(worker_cls, options)) == expected


def test_no_current_config_is_stock(platform):
    assert platform.communicator_qualname(None) is None


def test_platform_hook_reads_the_current_config(platform, monkeypatch):
    import vllm.config

    cls = platform.KogCudaPlatform
    stock = cls.__mro__[1].get_device_communicator_cls()  # the parent platform's (CUDA's on a GPU machine)
    assert stock != COMMUNICATOR_QUALNAME
    monkeypatch.setattr(vllm.config, "get_current_vllm_config_or_none", lambda: _config(WORKER_CLS, {"collective": True}))
    assert cls.get_device_communicator_cls() == COMMUNICATOR_QUALNAME
    monkeypatch.setattr(vllm.config, "get_current_vllm_config_or_none", lambda: _config(WORKER_CLS, {}))
    assert cls.get_device_communicator_cls() == stock
    monkeypatch.setattr(vllm.config, "get_current_vllm_config_or_none", lambda: None)
    assert cls.get_device_communicator_cls() == stock


def test_the_named_class_is_a_cuda_communicator():
    from vllm.distributed.device_communicators.cuda_communicator import CudaCommunicator
    from vllm.utils.import_utils import resolve_obj_by_qualname

    assert issubclass(resolve_obj_by_qualname(COMMUNICATOR_QUALNAME), CudaCommunicator)
