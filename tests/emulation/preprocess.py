"""Source rewrites that let g++ compile the project's CUDA files against cuda_emu.h.

Only three constructs of CUDA C++ are not C++ a host compiler accepts; each is rewritten into a call
of the emulator, leaving every other line of the kernels as written:

- ``kernel<<<grid, block, smem, stream>>>(args)`` -> ``::emu::launchKernel(::emu::LaunchConfig(grid,
  block, smem, stream), kernel, args)``;
- ``__shared__ T name[N]...;`` -> a reference to per-CTA storage (``::emu::staticSmem``), counted
  against the shared-memory limit and poisoned with NaN; ``extern __shared__ T name[];`` -> the CTA's
  dynamic shared memory;
- ``asm volatile("ptx" : outputs : inputs : clobbers);`` -> ``::emu::ptxExec("ptx", operands)``: the
  emulator decodes the PTX text itself, so instruction semantics never come from our helpers.
"""

from __future__ import annotations

import re
import zlib

_IDENT = r"[A-Za-z_]\w*"
_LAUNCH = re.compile(rf"({_IDENT}(?:\s*<[^<>;{{}}()]*>)?)\s*<<<(.*?)>>>\s*\(", re.S)
_EXTERN_SHARED = re.compile(
    r"extern\s+__shared__\s+(?:__align__\(\s*(\d+)\s*\)\s+)?([A-Za-z_][\w:\s]*?)\s+(" + _IDENT + r")\s*\[\s*\]\s*;"
)
_STATIC_SHARED = re.compile(
    r"(?<![\w])__shared__\s+(?:__align__\(\s*(\d+)\s*\)\s+)?([A-Za-z_][\w:\s<>,]*?)\s+(" + _IDENT + r")((?:\s*\[[^\]]+\])*)\s*;"
)


class RewriteError(ValueError):
    """A construct the rewriter does not understand (better to refuse than to emulate it wrongly)."""


def _matching(text: str, start: int, open_ch: str, close_ch: str) -> int:
    """Index of the bracket closing the one at ``start`` (skipping string literals)."""
    depth = 0
    i = start
    while i < len(text):
        ch = text[i]
        if ch == '"':
            i += 1
            while text[i] != '"':
                i += 2 if text[i] == "\\" else 1
        elif ch == open_ch:
            depth += 1
        elif ch == close_ch:
            depth -= 1
            if depth == 0:
                return i
        i += 1
    raise RewriteError(f"unbalanced {open_ch!r} at offset {start}")


def _split_top(text: str, sep: str) -> list[str]:
    """Split at ``sep`` outside brackets and string literals."""
    parts, depth, cur, i = [], 0, [], 0
    while i < len(text):
        ch = text[i]
        if ch == '"':
            j = i + 1
            while text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            cur.append(text[i : j + 1])
            i = j + 1
            continue
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        if ch == sep and depth == 0:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
        i += 1
    parts.append("".join(cur))
    return parts


def rewrite_launches(src: str) -> str:
    out, pos = [], 0
    for m in _LAUNCH.finditer(src):
        cfg = m.group(2).strip()
        out.append(src[pos : m.start()])
        paren = m.end() - 1
        close = _matching(src, paren, "(", ")")
        args = src[paren + 1 : close].strip()
        call = f"::emu::launchKernel(::emu::LaunchConfig({cfg}), {m.group(1).strip()}"
        call += f", {args})" if args else ")"
        out.append(call)
        pos = close + 1
    out.append(src[pos:])
    return "".join(out)


def rewrite_shared(src: str, file_key: str) -> str:
    base = zlib.crc32(file_key.encode()) & 0x3FFF
    counter = [0]

    def extern(m: re.Match[str]) -> str:
        typ, name = m.group(2).strip(), m.group(3)
        return f"{typ}* {name} = static_cast<{typ}*>(::emu::dynamicSmem());"

    def static(m: re.Match[str]) -> str:
        align, typ, name, dims = m.group(1) or "16", m.group(2).strip(), m.group(3), m.group(4) or ""
        dims = re.sub(r"\s+", "", dims) if dims else ""
        site = base * 10000 + counter[0]
        counter[0] += 1
        full = f"{typ}{dims}"
        ref = f"{typ} (&{name}){dims}" if dims else f"{typ}& {name}"
        return (
            f"{ref} = *static_cast<::std::add_pointer_t<{full}>>(::emu::staticSmem({site}, sizeof({full}), "
            f"alignof({full}) > {align} ? alignof({full}) : {align}));"
        )

    src = _EXTERN_SHARED.sub(extern, src)
    src = _STATIC_SHARED.sub(static, src)
    if re.search(r"(?<![\w])__shared__(?![\w])", src):
        line = src[: re.search(r"(?<![\w])__shared__(?![\w])", src).start()].count("\n") + 1
        raise RewriteError(f"{file_key}:{line}: a __shared__ declaration the emulator cannot rewrite")
    return src


def rewrite_asm(src: str, file_key: str) -> str:
    out, pos = [], 0
    for m in re.finditer(r"\basm\s+(?:volatile\s*)?\(", src):
        paren = m.end() - 1
        close = _matching(src, paren, "(", ")")
        body = src[paren + 1 : close]
        sections = _split_top(body, ":")
        template = sections[0].strip()
        if not template.startswith('"'):
            line = src[: m.start()].count("\n") + 1
            raise RewriteError(f"{file_key}:{line}: asm without a string template")
        operands: list[str] = []
        for kind, section in zip(("out", "in"), sections[1:3]):
            for op in _split_top(section, ","):
                op = op.strip()
                if not op:
                    continue
                cm = re.match(r'"([=+&]*)([a-z]+)"\s*\((.*)\)\s*$', op, re.S)
                if cm is None:
                    raise RewriteError(f"{file_key}: asm operand {op!r} not understood")
                mods, expr = cm.group(1), cm.group(3)
                operands.append(f"::emu::ptxOut({expr})" if kind == "out" or "+" in mods else f"::emu::ptxIn({expr})")
        ops = ", ".join(operands)
        out.append(src[pos : m.start()])
        if operands:
            out.append(
                f"do {{ ::emu::PtxOperand const emuOps[] = {{{ops}}}; ::emu::ptxExec({template}, emuOps, "
                f"{len(operands)}); }} while (0)"
            )
        else:
            out.append(f"::emu::ptxExec({template}, nullptr, 0)")
        pos = close + 1
    out.append(src[pos:])
    return "".join(out)


def rewrite(src: str, file_key: str) -> str:
    """All three rewrites of one source file (``file_key`` names it in errors and shared-memory sites)."""
    return rewrite_asm(rewrite_shared(rewrite_launches(src), file_key), file_key)
