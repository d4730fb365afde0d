"""Builds vLLM's real CLI parsers on a CPU machine, with or without kog's platform hook.

vLLM's engine parser needs a current platform with a device type (its config defaults build a DeviceConfig),
and kog_backend.engine.platform imports vllm.platforms.cuda, which loads libcuda. On a CPU machine both are replaced:
vLLM's CpuPlatform stands in for the CUDA platform class (`stand_in_cuda_module`), and the platform instance is
installed where vLLM looks it up (`vllm.platforms.current_platform`, and the name arg_utils bound at import).
"""

from __future__ import annotations

import argparse
import importlib
import sys
import types

import pytest


def stand_in_cuda_module() -> types.ModuleType:
    from vllm.platforms.cpu import CpuPlatform

    module = types.ModuleType("vllm.platforms.cuda")

    class CudaPlatform(CpuPlatform):
        """CPU stand-in for vllm.platforms.cuda.CudaPlatform (parser building needs only a device type)."""

    module.CudaPlatform = CudaPlatform
    return module


def import_kog_platform(monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest):
    """kog_backend.engine.platform imported over the stand-in CUDA module; unloaded again after the test."""
    monkeypatch.setitem(sys.modules, "vllm.platforms.cuda", stand_in_cuda_module())
    sys.modules.pop("kog_backend.engine.platform", None)

    def unload():
        sys.modules.pop("kog_backend.engine.platform", None)
        import kog_backend

        if hasattr(kog_backend, "platform"):
            delattr(kog_backend, "platform")

    request.addfinalizer(unload)
    return importlib.import_module("kog_backend.engine.platform")


def use_platform(monkeypatch: pytest.MonkeyPatch, platform) -> None:
    import vllm.engine.arg_utils as arg_utils
    import vllm.platforms

    monkeypatch.setattr(vllm.platforms, "current_platform", platform, raising=False)
    monkeypatch.setattr(arg_utils, "current_platform", platform)


def serve_parser():
    """The parser of `vllm serve` / the OpenAI api_server module (AsyncEngineArgs.add_cli_args inside)."""
    from vllm.entrypoints.openai.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    return make_arg_parser(FlexibleArgumentParser(prog="vllm serve"))


def vllm_cli_parser():
    """`vllm` with its `serve` subcommand, built as vllm.entrypoints.cli.main builds it."""
    from vllm.entrypoints.cli.serve import ServeSubcommand
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = FlexibleArgumentParser(prog="vllm")
    subparsers = parser.add_subparsers(required=False, dest="subparser")
    ServeSubcommand().subparser_init(subparsers)
    return parser


def parse_error(parser: argparse.ArgumentParser, argv: list[str], capsys) -> str:
    """The argparse error message of a refused command line (exit status 2)."""
    with pytest.raises(SystemExit) as exit_info:
        parser.parse_args(argv)
    assert exit_info.value.code == 2
    return capsys.readouterr().err
