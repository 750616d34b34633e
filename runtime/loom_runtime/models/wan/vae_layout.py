"""The tensor names and shapes of the Wan VAE's encoder side (encoder.*, quant_conv.*).

Loom runs only the decoder; this table lets the loader check the encoder's tensors and the
tiny checkpoint write a complete AutoencoderKLWan. Never holds or computes tensors.
"""

from __future__ import annotations

from loom_runtime.models.wan.config import WanVaeConfig

Shapes = dict[str, tuple[int, ...]]
ENCODER_PREFIXES = ("encoder.", "quant_conv.")


def encoder_shapes(config: WanVaeConfig) -> Shapes:
    """Every encoder-side tensor of an AutoencoderKLWan (Wan 2.1 or 2.2 layout) -> its shape."""
    c = config
    widths = [c.base_dim * m for m in (1, *c.dim_mult)]
    out: Shapes = {}
    out.update(_conv("encoder.conv_in", c.in_channels, widths[0], 3))
    out.update(_residual_down_blocks(c, widths) if c.is_residual else _down_blocks(c, widths))
    top = widths[-1]
    out.update(_residual("encoder.mid_block.resnets.0", top, top))
    out.update(_attention("encoder.mid_block.attentions.0", top))
    out.update(_residual("encoder.mid_block.resnets.1", top, top))
    out["encoder.norm_out.gamma"] = (top, 1, 1, 1)
    out.update(_conv("encoder.conv_out", top, 2 * c.z_dim, 3))
    out.update(_conv("quant_conv", 2 * c.z_dim, 2 * c.z_dim, 1))
    return out


def _down_blocks(c: WanVaeConfig, widths: list[int]) -> Shapes:
    """Wan 2.1: one flat list of residual blocks, attention blocks and downsamplers."""
    out: Shapes = {}
    index, scale = 0, 1.0
    levels = len(c.dim_mult)
    for level in range(levels):
        in_ch, out_ch = widths[level], widths[level + 1]
        for _ in range(c.num_res_blocks):
            out.update(_residual(f"encoder.down_blocks.{index}", in_ch, out_ch))
            index += 1
            if scale in c.attn_scales:
                out.update(_attention(f"encoder.down_blocks.{index}", out_ch))
                index += 1
            in_ch = out_ch
        if level != levels - 1:
            out.update(
                _downsample(f"encoder.down_blocks.{index}", out_ch, c.temperal_downsample[level])
            )
            index += 1
            scale /= 2.0
    return out


def _residual_down_blocks(c: WanVaeConfig, widths: list[int]) -> Shapes:
    """Wan 2.2: one block per level (residual blocks, then its downsampler); the averaging
    shortcut has no weights."""
    out: Shapes = {}
    levels = len(c.dim_mult)
    for level in range(levels):
        name = f"encoder.down_blocks.{level}"
        in_ch, out_ch = widths[level], widths[level + 1]
        for j in range(c.num_res_blocks):
            out.update(_residual(f"{name}.resnets.{j}", in_ch, out_ch))
            in_ch = out_ch
        if level != levels - 1:
            out.update(_downsample(f"{name}.downsampler", out_ch, c.temperal_downsample[level]))
    return out


def _conv(name: str, in_ch: int, out_ch: int, k: int) -> Shapes:
    shapes: Shapes = {f"{name}.weight": (out_ch, in_ch, k, k, k), f"{name}.bias": (out_ch,)}
    return shapes


def _residual(name: str, in_ch: int, out_ch: int) -> Shapes:
    out: Shapes = {
        f"{name}.norm1.gamma": (in_ch, 1, 1, 1),
        f"{name}.norm2.gamma": (out_ch, 1, 1, 1),
    }
    out.update(_conv(f"{name}.conv1", in_ch, out_ch, 3))
    out.update(_conv(f"{name}.conv2", out_ch, out_ch, 3))
    if in_ch != out_ch:
        out.update(_conv(f"{name}.conv_shortcut", in_ch, out_ch, 1))
    return out


def _attention(name: str, ch: int) -> Shapes:
    shapes: Shapes = {
        f"{name}.norm.gamma": (ch, 1, 1),
        f"{name}.to_qkv.weight": (3 * ch, ch, 1, 1),
        f"{name}.to_qkv.bias": (3 * ch,),
        f"{name}.proj.weight": (ch, ch, 1, 1),
        f"{name}.proj.bias": (ch,),
    }
    return shapes


def _downsample(name: str, ch: int, temporal: bool) -> Shapes:
    out: Shapes = {f"{name}.resample.1.weight": (ch, ch, 3, 3), f"{name}.resample.1.bias": (ch,)}
    if temporal:
        out[f"{name}.time_conv.weight"] = (ch, ch, 3, 1, 1)
        out[f"{name}.time_conv.bias"] = (ch,)
    return out
