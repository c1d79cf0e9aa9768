"""What a built candidate library would run or change while it is being loaded: read off the ELF.

A library's own code must not run before the driver's final system-call filter is in force, so
the built file (not the source: attributes, pragmas, linker tricks and assembly all end up
here) is refused when the dynamic loader would run any of its code or weaken the process:

* initialisers and finalisers: ``DT_INIT``, ``DT_INIT_ARRAY``, ``DT_PREINIT_ARRAY``,
  ``DT_FINI``, ``DT_FINI_ARRAY`` (and ``.init``/``.ctors`` style sections);
* GNU indirect functions: a defined ``STT_GNU_IFUNC`` symbol (``dlsym`` or a relocation calls
  its resolver) or an ``IRELATIVE`` relocation;
* thread-local storage (``PT_TLS``: its set-up is the loader's, and no kernel needs it);
* text relocations, a segment both writable and executable, an executable stack (the loader
  would have to make memory executable), and loader directives that load other code
  (``DT_AUDIT``, ``DT_FILTER``, ``DT_AUXILIARY``, ``DT_RPATH``/``DT_RUNPATH``, a
  ``DT_NEEDED`` outside the C runtime the backend links).

The parser reads what the loader reads (program headers and the dynamic segment), plus the
section headers as a second opinion; a file it cannot parse is refused too.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

PT_LOAD, PT_DYNAMIC, PT_INTERP, PT_TLS, PT_GNU_STACK = 1, 2, 3, 7, 0x6474E551
PF_X, PF_W = 1, 2
DT_NULL, DT_NEEDED, DT_PLTRELSZ, DT_STRTAB, DT_SYMTAB, DT_RELA, DT_RELASZ = 0, 1, 2, 5, 6, 7, 8
DT_STRSZ, DT_SYMENT, DT_INIT, DT_FINI, DT_RPATH, DT_REL, DT_RELSZ = 10, 11, 12, 13, 15, 17, 18
DT_TEXTREL, DT_JMPREL, DT_INIT_ARRAY, DT_FINI_ARRAY, DT_RUNPATH, DT_FLAGS = 22, 23, 25, 26, 29, 30
DT_PREINIT_ARRAY, DT_GNU_HASH, DT_HASH = 32, 0x6FFFFEF5, 4
DT_AUDIT, DT_DEPAUDIT, DT_AUXILIARY, DT_FILTER = 0x6FFFFEFC, 0x6FFFFEFB, 0x7FFFFFFD, 0x7FFFFFFF
DF_TEXTREL = 4
STT_GNU_IFUNC = 10
SHT_SYMTAB, SHT_DYNSYM = 2, 11
SHT_LOAD_TIME = (14, 15, 16)  # INIT_ARRAY, FINI_ARRAY, PREINIT_ARRAY, whatever their names
EM_X86_64, EM_AARCH64 = 62, 183
IRELATIVE = {EM_X86_64: 37, EM_AARCH64: 1032}

# what the C backend links: the C runtime, libm and the OpenMP runtime (already in the driver)
RUNTIME_LIBS = ("libc.so.6", "libm.so.6", "libmvec.so.1", "libgomp.so.1", "libgcc_s.so.1",
                "libdl.so.2", "libpthread.so.0", "ld-linux-x86-64.so.2", "ld-linux-aarch64.so.1")
LOAD_TIME_SECTIONS = (".init", ".fini", ".init_array", ".fini_array", ".preinit_array", ".ctors",
                      ".dtors", ".tdata", ".tbss")

_NAMES = {DT_INIT: "an initialiser (DT_INIT)", DT_FINI: "a finaliser (DT_FINI)",
          DT_INIT_ARRAY: "constructors (DT_INIT_ARRAY)", DT_FINI_ARRAY: "destructors (DT_FINI_ARRAY)",
          DT_PREINIT_ARRAY: "pre-initialisers (DT_PREINIT_ARRAY)",
          DT_TEXTREL: "text relocations (DT_TEXTREL)", DT_AUDIT: "an audit library (DT_AUDIT)",
          DT_DEPAUDIT: "an audit library (DT_DEPAUDIT)", DT_AUXILIARY: "a filter library (DT_AUXILIARY)",
          DT_FILTER: "a filter library (DT_FILTER)", DT_RPATH: "a library search path (DT_RPATH)",
          DT_RUNPATH: "a library search path (DT_RUNPATH)"}


@dataclass(frozen=True)
class _Elf:
    data: bytes
    machine: int
    phdrs: list[tuple[int, int, int, int, int, int]]   # type, flags, offset, vaddr, filesz, memsz
    shdrs: list[tuple[str, int, int, int, int, int]]   # name, type, offset, size, link, entsize

    def offset_of(self, vaddr: int) -> int | None:
        for p_type, _, off, va, filesz, _ in self.phdrs:
            if p_type == PT_LOAD and va <= vaddr < va + filesz:
                return off + vaddr - va
        return None


def _parse(data: bytes) -> _Elf:
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        raise ValueError("not a little-endian 64-bit ELF file")
    (e_type, machine, _, _, phoff, shoff, _, _, phentsize, phnum, shentsize, shnum,
     shstrndx) = struct.unpack_from("<HHIQQQIHHHHHH", data, 16)
    if e_type != 3:
        raise ValueError(f"ELF type {e_type}, not a shared object")
    phdrs = []
    for i in range(phnum):
        p_type, flags, off, va, _, filesz, memsz, _ = struct.unpack_from("<IIQQQQQQ", data, phoff + i * phentsize)
        phdrs.append((p_type, flags, off, va, filesz, memsz))
    raw = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize) for i in range(shnum)] if shoff else []
    names = raw[shstrndx][4] if raw and shstrndx < len(raw) else 0
    shdrs = []
    for name, s_type, _, _, off, size, link, _, _, entsize in raw:
        end = data.find(b"\0", names + name)
        shdrs.append((data[names + name:end].decode(errors="replace"), s_type, off, size, link, entsize))
    return _Elf(data, machine, phdrs, shdrs)


def _cstr(data: bytes, at: int) -> str:
    end = data.find(b"\0", at)
    return data[at:end if end >= 0 else len(data)].decode(errors="replace")


def load_time_code(path: str) -> str | None:
    """None if loading the library at ``path`` runs none of its code and weakens nothing; else a
    one-line reason naming what the loader would run or do."""
    try:
        with open(path, "rb") as f:
            elf = _parse(f.read())
        return _check(elf)
    except (OSError, ValueError, struct.error, IndexError) as exc:
        return f"the library cannot be read as an ELF shared object ({exc})"


def _check(elf: _Elf) -> str | None:
    data = elf.data
    dynamic = None
    for p_type, flags, off, _, filesz, _ in elf.phdrs:
        if p_type == PT_LOAD and flags & PF_W and flags & PF_X:
            return "a segment is both writable and executable (code that can rewrite itself)"
        if p_type == PT_GNU_STACK and flags & PF_X:
            return "it asks for an executable stack (the loader would make memory executable)"
        if p_type == PT_TLS:
            return "thread-local storage (its initialisation is load-time work; kernels need none)"
        if p_type == PT_INTERP:
            return "it names a program interpreter (an executable, not a kernel library)"
        if p_type == PT_DYNAMIC:
            dynamic = (off, filesz)
    for name, s_type, *_ in elf.shdrs:
        if s_type in SHT_LOAD_TIME or name in LOAD_TIME_SECTIONS or name.startswith((".init_array.", ".fini_array.", ".ctors.", ".dtors.")):
            return f"a load-time section `{name}` (code that would run before the sandbox is complete)"
    if dynamic is None:
        return "no dynamic segment"
    tags: dict[int, list[int]] = {}
    off, size = dynamic
    for at in range(off, off + size - 15, 16):
        tag, val = struct.unpack_from("<qQ", data, at)
        if tag == DT_NULL:
            break
        tags.setdefault(tag, []).append(val)
    for tag, what in _NAMES.items():
        if tag in tags and not (tag in (DT_INIT_ARRAY, DT_FINI_ARRAY, DT_PREINIT_ARRAY) and
                                _array_empty(tags, tag)):
            return f"{what}: the loader would run or follow it before the sandbox is complete"
    if tags.get(DT_FLAGS, [0])[0] & DF_TEXTREL:
        return "text relocations (DF_TEXTREL)"
    strtab = elf.offset_of(tags.get(DT_STRTAB, [0])[0])
    for needed in tags.get(DT_NEEDED, []):
        name = _cstr(data, strtab + needed) if strtab is not None else "?"
        if name not in RUNTIME_LIBS:
            return f"it needs the library `{name}`, outside the C runtime a kernel is linked with"
    return _ifuncs(elf, tags)


def _array_empty(tags: dict, tag: int) -> bool:
    size_tag = {DT_INIT_ARRAY: 27, DT_FINI_ARRAY: 28, DT_PREINIT_ARRAY: 33}[tag]
    return tags.get(size_tag, [0])[0] == 0


def _ifuncs(elf: _Elf, tags: dict) -> str | None:
    data, irel = elf.data, IRELATIVE.get(elf.machine, -1)
    symtab = elf.offset_of(tags.get(DT_SYMTAB, [0])[0]) if DT_SYMTAB in tags else None
    strtab = elf.offset_of(tags.get(DT_STRTAB, [0])[0]) if DT_STRTAB in tags else None
    syment = tags.get(DT_SYMENT, [24])[0] or 24
    # every relocation the loader applies: an IRELATIVE one calls a resolver
    for table, size in ((DT_RELA, DT_RELASZ), (DT_JMPREL, DT_PLTRELSZ)):
        if table not in tags:
            continue
        start = elf.offset_of(tags[table][0])
        if start is None:
            return "a relocation table outside the file's loaded segments"
        for at in range(start, start + tags.get(size, [0])[0], 24):
            _, info, _ = struct.unpack_from("<QQq", data, at)
            if info & 0xFFFFFFFF == irel:
                return "an IRELATIVE relocation (a GNU ifunc resolver the loader would call)"
            sym = info >> 32
            if sym and symtab is not None:
                st_info, st_shndx = struct.unpack_from("<BxH", data, symtab + sym * syment + 4)
                if st_info & 0xF == STT_GNU_IFUNC and st_shndx:
                    return f"a GNU ifunc `{_symname(data, strtab, symtab, sym, syment)}` (its resolver runs at load)"
    if DT_REL in tags:
        return "REL relocations (this backend produces RELA only)"
    # every defined symbol: dlsym on an ifunc calls its resolver too
    for _, s_type, off, size, link, entsize in elf.shdrs:
        if s_type not in (SHT_DYNSYM, SHT_SYMTAB):
            continue
        names_at = elf.shdrs[link][2] if link < len(elf.shdrs) else None
        for at in range(off, off + size, entsize or 24):
            st_name, st_info, _, st_shndx = struct.unpack_from("<IBBH", data, at)
            if st_info & 0xF == STT_GNU_IFUNC and st_shndx:
                sym = _cstr(data, names_at + st_name) if names_at is not None else "?"
                return f"a GNU ifunc `{sym}` (its resolver runs at load)"
    return None


def _symname(data: bytes, strtab: int | None, symtab: int, index: int, syment: int) -> str:
    if strtab is None:
        return "?"
    (st_name,) = struct.unpack_from("<I", data, symtab + index * syment)
    return _cstr(data, strtab + st_name)
