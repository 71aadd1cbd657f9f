"""Teach the `gguf` package Strata's Q2_0 (ggml type 42), which upstream ggml does not define."""

import gguf

Q2_0_TYPE_ID = 42
Q2_0_BLOCK = (64, 18)  # weights per block, bytes per block: fp16 d + 16 bytes of 2-bit codes


def register_q2_0() -> gguf.GGMLQuantizationType:
    """Add Q2_0 to gguf's IntEnum and size table so GGUFReader/GGUFWriter accept it; idempotent."""
    enum_cls = gguf.GGMLQuantizationType
    member = enum_cls._value2member_map_.get(Q2_0_TYPE_ID)
    if member is None:
        # IntEnum has no public way to grow; this mirrors what Enum does for its own members.
        member = int.__new__(enum_cls, Q2_0_TYPE_ID)
        member._name_, member._value_ = "Q2_0", Q2_0_TYPE_ID
        enum_cls._value2member_map_[Q2_0_TYPE_ID] = member
        enum_cls._member_map_["Q2_0"] = member
        enum_cls._member_names_.append("Q2_0")
    gguf.GGML_QUANT_SIZES[member] = Q2_0_BLOCK
    return member


Q2_0 = register_q2_0()
