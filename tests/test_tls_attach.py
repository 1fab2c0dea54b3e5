"""Finding TLS implementations in mapped files and attaching once per file (no BPF needed)."""

from __future__ import annotations

import os
import shutil
import ssl  # noqa: F401 -- maps libssl into this process, as a Python TLS server would
from pathlib import Path

from otel_ebpf.probes.tls import ENTRY_PROGRAMS, RETURN_PROGRAM, TLSAttacher, mapped_files, system_libssl


def test_this_process_maps_the_system_libssl() -> None:
    (libssl,) = system_libssl()
    assert Path(libssl).name.startswith("libssl.so")
    assert libssl in {os.path.realpath(f) for f in mapped_files(os.getpid())}
    assert mapped_files(2**22) == set()  # no such process


class Recorder:
    """Stands in for BCC: symbol tables by file, and the attach calls made."""

    def __init__(self, symbols: dict[str, set[str]], failing: str | None = None) -> None:
        self.symbols = {os.stat(path).st_ino: found for path, found in symbols.items()}  # by file, not name
        self.failing = failing
        self.attached: list[tuple[str, str, str, bool]] = []

    def lookup(self, path: str) -> set[str]:
        return self.symbols.get(os.stat(path).st_ino, set())

    def attach(self, path: str, symbol: str, program: str, is_return: bool) -> None:
        if path == self.failing:
            raise Exception(f"could not attach to {symbol}")  # what BCC raises
        self.attached.append((path, symbol, program, is_return))


def test_each_file_is_hooked_once_with_the_symbols_it_has(tmp_path: Path) -> None:
    libssl, copy, cygrpc, libc, broken = (tmp_path / name for name in (
        "libssl.so.3", "libssl-copy.so", "cygrpc.cpython-311-x86_64-linux-gnu.so", "libc.so.6", "libssl-broken.so"))
    for path in (libssl, cygrpc, libc, broken):
        path.write_bytes(b"\x7fELF")
    shutil.copy(libssl, copy)
    os.link(libssl, tmp_path / "libssl.so")  # the same file under another name
    recorder = Recorder({
        str(libssl): {"SSL_read", "SSL_write", "SSL_read_ex", "SSL_write_ex", "SSL_do_handshake"},
        str(copy): {"SSL_read", "SSL_write"},
        str(broken): {"SSL_read", "SSL_write"},
    }, failing=str(broken))
    attacher = TLSAttacher(recorder.lookup, recorder.attach)
    attacher.scan([], [str(libssl), str(tmp_path / "libssl.so"), str(copy), str(cygrpc), str(libc), str(broken)])
    attacher.scan([], [str(libssl), str(copy)])  # rescans attach nothing twice

    hooked = attacher.libraries.hooked
    assert hooked == {
        str(tmp_path / "libssl.so"): ("SSL_do_handshake", "SSL_read", "SSL_read_ex", "SSL_write", "SSL_write_ex"),
        str(copy): ("SSL_read", "SSL_write"),
    }
    assert attacher.libraries.without_symbols == {str(cygrpc)}  # libc is no TLS library: not reported
    assert str(broken) in attacher.libraries.failed
    entries = [(p, s, prog) for p, s, prog, ret in recorder.attached if not ret]
    returns = [(p, s, prog) for p, s, prog, ret in recorder.attached if ret]
    assert sorted(entries) == sorted((p, s, ENTRY_PROGRAMS[s]) for p, symbols in hooked.items() for s in symbols)
    assert sorted(returns) == sorted((p, s, RETURN_PROGRAM) for p, symbols in hooked.items() for s in symbols)
    assert len(recorder.attached) == len(set(recorder.attached))
