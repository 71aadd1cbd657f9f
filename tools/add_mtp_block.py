"""Add a training checkpoint's Qwen3-Next MTP block to a GGUF exported without it, leaving every other byte's
meaning alone: the metadata and the main model's tensors are copied as they are (so its outputs, hash-pinned tests
aside, do not move), and the `mtp.*` tensors are encoded by tools/export_hf.py as blk.N.nextn.* + blk.N.* with
`block_count` N + 1 and `nextn_predict_layers` 1.

    python tools/add_mtp_block.py --gguf model.gguf --checkpoint run/checkpoint -o model-mtp.gguf

The checkpoint may be the bfloat16 copy the device run returns: its MTP weights then go through bfloat16 before
Q8_0, whose own rounding is some 30 times coarser.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import gguf
import numpy as np
import torch

if __package__ in (None, ""):  # run as a script: make `strata` and `tools` importable from the repo root
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tools import export_hf  # noqa: E402

_COUNT_FIELDS = ("GGUF.version", "GGUF.tensor_count", "GGUF.kv_count")


def _checkpoint_tensors(checkpoint: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    files = sorted(checkpoint.glob("model*.safetensors"))
    if not files:
        raise SystemExit(f"{checkpoint}: no model*.safetensors")
    tensors = load_file(files[0])  # model.safetensors, or the bfloat16 copy model.bf16.safetensors
    return {name: value.float() for name, value in tensors.items() if name.startswith("mtp.")}


def mtp_sources(checkpoint: Path) -> tuple[object, list[tuple[str, np.ndarray, str]]]:
    """(config, [(GGUF name, float32 array, stored qtype name)]) of the checkpoint's MTP block."""
    from transformers import Qwen3NextConfig, Qwen3NextForCausalLM

    config = Qwen3NextConfig.from_dict(json.loads((checkpoint / "config.json").read_text()))
    with torch.device("meta"):  # the main weights are not needed: only the block's names and shapes
        model = Qwen3NextForCausalLM(config)
    export_hf.attach_checkpoint_mtp(model, _checkpoint_tensors(checkpoint))
    prefix = f"blk.{config.num_hidden_layers}."
    params = dict(model.named_parameters())
    sources = [s for s in export_hf.tensor_sources(model) if s.gguf_name.startswith(prefix)]
    return config, [(s.gguf_name, export_hf._source_array(params, s), s) for s in sources]


def add_mtp_block(gguf_in: Path, checkpoint: Path, gguf_out: Path, qtype: str = "Q8_0") -> int:
    """Write gguf_out = gguf_in + the MTP block; returns the number of tensors added."""
    reader = gguf.GGUFReader(gguf_in)
    arch = reader.fields["general.architecture"].contents()
    config, block = mtp_sources(checkpoint)
    n_layers = reader.fields[f"{arch}.block_count"].contents()
    if n_layers != config.num_hidden_layers or f"{arch}.nextn_predict_layers" in reader.fields:
        raise SystemExit(f"{gguf_in}: {n_layers} blocks, already an MTP block or not the checkpoint's model")

    writer = gguf.GGUFWriter(str(gguf_out), arch)
    for name, field in reader.fields.items():
        if name in _COUNT_FIELDS or name == "general.architecture":
            continue  # the writer writes these itself
        value = field.contents()
        if name == f"{arch}.block_count":
            value = n_layers + 1
        sub_type = field.types[-1] if field.types[0] == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(name, value, field.types[0], sub_type=sub_type)
    writer.add_nextn_predict_layers(1)
    for tensor in reader.tensors:
        writer.add_tensor(tensor.name, np.asarray(tensor.data), raw_dtype=tensor.tensor_type)
    for name, array, _ in block:
        stored = export_hf.stored_qtype(name, array.ndim, qtype)
        data = export_hf.encode(array, stored)
        writer.add_tensor(name, data, raw_dtype=export_hf.QTYPES[stored] if data.dtype == np.uint8 else None)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return len(block)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gguf", type=Path, required=True)
    parser.add_argument("--checkpoint", type=Path, required=True)
    parser.add_argument("-o", "--output", type=Path, required=True)
    parser.add_argument("--qtype", default="Q8_0")
    args = parser.parse_args(argv)
    added = add_mtp_block(args.gguf, args.checkpoint, args.output, args.qtype)
    print(f"wrote {args.output}: {args.gguf.name} + {added} MTP tensors")


if __name__ == "__main__":
    main()
