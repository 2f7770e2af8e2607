"""Hidden-state storage behind one small interface, in two layouts.

Every stored row carries the **fingerprint** of what produced it (target config and weight files,
auxiliary layers, backend, dtype) next to its token ids; a row is reused only when both match,
so changing ``aux_layers``, the target or the backend never trains on stale states.

Layouts (``hidden_states.layout``):

- ``per_row``: speculators' own layout, one ``hs_<row>.safetensors`` per row (``hidden_states``
  bf16 ``[seq, 4, H]``, ``token_ids`` int64 ``[seq]``, the fingerprint in the file's metadata).
- ``shards`` (default): many rows per ``shards/shard_<n>.safetensors`` (tensors ``<row>.hidden_states``
  and ``<row>.token_ids``), written once ``shard_mb`` is reached, with an append-only
  ``index.jsonl`` (rows, token-id digests, fingerprint, bytes, an xxh3-128 checksum per shard). Millions of
  small files hurt every shared filesystem; shards keep the file count in the thousands.

Storage (``hidden_states.storage``): ``bf16`` as computed, or ``fp8`` (float8_e4m3fn, one float32
scale per token and stored layer in ``hidden_states_scale``: the largest magnitude maps to 448),
about half the bytes. Files are self-describing: a reader dequantizes where it finds a scale, and
the storage is part of the fingerprint, so a store written in one is never reused as the other.

Both are written atomically (temporary name, fsync, rename; an index line only after its shard is
in place), so a kill loses at most the rows not yet in a file. Training reads either layout through
:class:`ShardTransfer`, a speculators ``HiddenStatesTransfer`` registered as the ``draftsmith``
backend, from a list of row locations: no per-row links, no copies.
"""

from __future__ import annotations

import json
import os
import queue
import threading
from abc import ABC, abstractmethod
from collections import OrderedDict, deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import xxhash
from hs_connectors import HiddenStatesBackend, HiddenStatesTransfer
from safetensors import safe_open
from safetensors.torch import save_file

from draftsmith.core import jsonl, platform
from draftsmith.core.digest import file_sha256, ids_digest, json_digest

FINGERPRINT_KEY = "draftsmith_fingerprint"
STORED_DTYPE = torch.bfloat16  # whatever the target computed in (see draftsmith.core.compute)
STORAGES = {"bf16": "bfloat16", "fp8": "float8_e4m3fn, a float32 scale per token and layer"}
SCALE = "hidden_states_scale"
FP8_MAX = torch.finfo(torch.float8_e4m3fn).max


def fingerprint(target: dict, aux_layers: list[int], final_layer: int, backend: str, storage: str = "bf16") -> str:
    return json_digest({"target": target, "layers": [*aux_layers, final_layer], "backend": backend,
                        "dtype": STORAGES[storage]})


def encode(hidden_states: torch.Tensor, storage: str) -> dict[str, torch.Tensor]:
    """The tensors that store ``hidden_states`` ``[seq, layers, hidden]`` (on their device)."""
    if storage == "bf16":
        return {"hidden_states": hidden_states.to(STORED_DTYPE).contiguous()}
    if storage != "fp8":
        raise ValueError(f"unknown hidden-state storage {storage!r}; use one of {', '.join(STORAGES)}")
    largest = hidden_states.abs().amax(dim=-1).float().clamp(min=torch.finfo(torch.float32).tiny)
    # not in place: .float() of a float32 input is the caller's tensor
    quantized = (hidden_states.float() * (FP8_MAX / largest)[..., None]).to(torch.float8_e4m3fn)
    return {"hidden_states": quantized.contiguous(), SCALE: (largest / FP8_MAX).contiguous()}


def decode(stored: torch.Tensor, scale: torch.Tensor | None) -> torch.Tensor:
    """bf16 hidden states from what :func:`encode` stored (``scale`` None: stored as bf16)."""
    if scale is None:
        return stored
    # In bf16 throughout (1.7x faster on a CPU than through fp32; the scale's rounding, 2^-9, is far
    # below fp8's own, 2^-4): dataloader workers dequantize every row of every epoch.
    return stored.to(STORED_DTYPE).mul_(scale.to(STORED_DTYPE)[..., None])


def _read(fh, prefix: str = "", keys: set[str] | None = None) -> dict[str, torch.Tensor]:
    """A row's states (dequantized) and token ids from an open safetensors file (``keys``: its tensor
    names, when the caller keeps them)."""
    scale = fh.get_tensor(prefix + SCALE) if prefix + SCALE in (keys or set(fh.keys())) else None
    return {"hidden_states": decode(fh.get_tensor(prefix + "hidden_states"), scale),
            "token_ids": fh.get_tensor(prefix + "token_ids")}


class HiddenStateStore(ABC):
    """Where one dataset's hidden states live."""

    layout: str

    def __init__(self, folder: Path, fingerprint: str, storage: str = "bf16"):
        self.folder = folder
        self.fingerprint = fingerprint
        self.storage = storage  # how its writer stores; its files say how they were stored
        folder.mkdir(parents=True, exist_ok=True)

    @abstractmethod
    def done(self, rows: list[list[int]]) -> set[int]:
        """Rows (by index into ``rows``, their token ids) already stored with this fingerprint."""

    @abstractmethod
    def writer(self) -> Writer:
        """A context manager whose ``write(row, hidden_states, token_ids)`` stores a row."""

    @abstractmethod
    def read(self, row: int) -> dict[str, torch.Tensor]:
        ...

    @abstractmethod
    def locations(self, rows: list[int]) -> list[tuple[str, str]]:
        """``(file, tensor-name prefix)`` of each row, for the training reader."""

    @abstractmethod
    def describe(self) -> dict:
        """What the manifest records: layout, files, bytes (and per-shard checksums)."""

    @abstractmethod
    def purge_stale(self) -> int:
        """Delete files that can never be used again (another fingerprint); return bytes freed."""


class Writer(ABC):
    def __enter__(self) -> Writer:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @abstractmethod
    def write(self, row: int, hidden_states: torch.Tensor, token_ids: torch.Tensor) -> None:
        ...

    def close(self) -> None:  # noqa: B027 - per-row files need no closing
        pass


def _fsync_replace(tmp: Path, dest: Path) -> None:
    with tmp.open("rb") as fh:
        os.fsync(fh.fileno())
    os.replace(tmp, dest)


# --- one file per row --------------------------------------------------------------------------

class PerRowStore(HiddenStateStore):
    layout = "per_row"

    def path(self, row: int) -> Path:
        return self.folder / f"hs_{row}.safetensors"

    def _matches(self, row: int, ids: list[int]) -> bool:
        try:
            with safe_open(self.path(row), framework="pt") as fh:
                return (fh.metadata() or {}).get(FINGERPRINT_KEY) == self.fingerprint and \
                    fh.get_tensor("token_ids").tolist() == list(ids)
        except Exception:  # missing, truncated or foreign file: extract again
            return False

    def done(self, rows: list[list[int]]) -> set[int]:
        return {i for i, ids in enumerate(rows) if self._matches(i, ids)}

    def writer(self) -> Writer:
        return _RowWriter(self)

    def read(self, row: int) -> dict[str, torch.Tensor]:
        with safe_open(self.path(row), framework="pt") as fh:
            return _read(fh)

    def locations(self, rows: list[int]) -> list[tuple[str, str]]:
        return [(str(self.path(r)), "") for r in rows]

    def files(self) -> list[Path]:
        return sorted(self.folder.glob("hs_*.safetensors"))

    def describe(self) -> dict:
        files = self.files()
        return {"layout": self.layout, "files": len(files), "bytes": sum(p.stat().st_size for p in files)}

    def purge_stale(self) -> int:
        freed = 0
        for path in self.files():
            try:
                with safe_open(path, framework="pt") as fh:
                    stale = (fh.metadata() or {}).get(FINGERPRINT_KEY) != self.fingerprint
            except Exception:
                stale = True
            if stale:
                freed += path.stat().st_size
                path.unlink()
        return freed


class _RowWriter(Writer):
    def __init__(self, store: PerRowStore):
        self.store = store

    def write(self, row: int, hidden_states: torch.Tensor, token_ids: torch.Tensor) -> None:
        dest = self.store.path(row)
        tmp = dest.with_suffix(".partial")
        save_file({**encode(hidden_states, self.store.storage), "token_ids": token_ids.to(torch.int64).contiguous()},
                  str(tmp), metadata={FINGERPRINT_KEY: self.store.fingerprint})
        _fsync_replace(tmp, dest)


# --- packed shards -----------------------------------------------------------------------------

CHECKSUM = "xxh3_128"  # the index's checksum of each shard since issue 37 (older lines: "sha256")
# Rows queued for the writer thread, in bytes: the extraction runs ahead of storage by at most this
# (one row more when a single row is larger).
QUEUE_BYTES = 1 << 30
# Page-locked host memory for rows coming from a GPU (PinnedPool), allocated once: the same bound.
PINNED_BYTES = QUEUE_BYTES
# Writes from the writer thread in pieces of this size, each hashed meanwhile on the hasher's thread
# (_Hasher). Profiled on a 2-core AMD EPYC into tmpfs: the writer thread spent ~95% of its time in
# write(2), and 256 KiB writes ran at 1.9 GB/s where 64 MB ones ran at 2.5 (one process, alternating):
# small pieces were the cost, chosen before so that the hash read each piece into L2 just before its
# write. With the hash beside the write, pieces of 16 MiB: 0.98x a plain write+fsync (0.80x before).
WRITE_CHUNK = 16 << 20
SAFETENSORS_DTYPES = {torch.bfloat16: "BF16", torch.float8_e4m3fn: "F8_E4M3", torch.float32: "F32",
                      torch.int64: "I64"}


def _checksum_matches(path: Path, entry: dict) -> bool:
    """Against the index line's checksum: xxh3-128, or sha256 for shards written before it. A line with
    neither (cut or edited by hand) vouches for nothing: the shard counts as damaged."""
    if CHECKSUM in entry:
        return shard_checksum(path) == entry[CHECKSUM]
    if "sha256" in entry:
        return file_sha256(path) == entry["sha256"]
    return False


def shard_checksum(path: Path) -> str:
    """xxh3-128 of a shard as :class:`_ShardFile` computes it while writing: the tensor bytes, then the
    header (its 8-byte length and JSON); a corrupt byte anywhere changes it."""
    with Path(path).open("rb") as fh:
        head = fh.read(8)
        header = head + fh.read(int.from_bytes(head, "little"))
        digest = xxhash.xxh3_128()
        for chunk in iter(lambda: fh.read(1 << 24), b""):
            digest.update(chunk)
    digest.update(header)
    return digest.hexdigest()


def _header_size(entries: dict[str, dict]) -> int:
    """Bytes these entries take in the header's compact JSON (a comma each included)."""
    return sum(len(json.dumps({name: entry}, separators=(",", ":"))) - 1 for name, entry in entries.items())


class _Hasher:
    """xxh3-128 of a stream of pieces, computed on a thread of its own while the writer thread writes the
    same pieces (python-xxhash hashes without the GIL): the hash is off the writer's path, which can then
    make large writes (:data:`WRITE_CHUNK`). ``wait`` returns once every piece given so far is hashed: the
    caller may then reuse their memory (a pinned block goes back to its pool)."""

    def __init__(self):
        self.pieces: queue.Queue = queue.Queue()
        self.digest = xxhash.xxh3_128()
        self.thread = threading.Thread(target=self._run, name="shard-hasher", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while (piece := self.pieces.get()) is not None:
            self.digest.update(piece)
            self.pieces.task_done()
        self.pieces.task_done()

    def update(self, piece: memoryview | bytes) -> None:
        self.pieces.put(piece)

    def wait(self) -> None:
        self.pieces.join()

    def hexdigest(self) -> str:
        """The stream's checksum; the hasher starts over for the next one."""
        self.wait()
        value = self.digest.hexdigest()
        self.digest.reset()
        return value

    def close(self) -> None:
        self.pieces.put(None)
        self.thread.join()


class _ShardFile:
    """One shard streamed to its temporary file as rows arrive: no copy of the shard in memory.

    safetensors puts its JSON header first, and the header names every tensor's offsets, so the
    file starts with ``header_bytes`` reserved (the format allows a header padded with spaces) and
    the header is written there last. The shard is full when its data reach the store's size or
    its header the reserved room. The checksum is computed as the bytes go out (xxh3-128 runs at
    many GB/s: faster than any disk, unlike sha256's ~2 GB/s on one core)."""

    def __init__(self, tmp: Path, header_bytes: int, hasher: _Hasher):
        self.tmp = tmp
        self.header_bytes = header_bytes
        self.fh = tmp.open("wb", buffering=0)
        self.fh.seek(8 + header_bytes)
        self.entries: dict[str, dict] = {}
        self.header_used = 2  # "{}"
        self.data_bytes = 0
        self.hasher = hasher

    def fits(self, names: list[str], tensors: list[torch.Tensor]) -> bool:
        """Whether the header still has room for these tensors (and the fingerprint's metadata)."""
        return self.header_used + _header_size(self._entries(names, tensors)) + 256 <= self.header_bytes

    def _entries(self, names: list[str], tensors: list[torch.Tensor]) -> dict[str, dict]:
        out, offset = {}, self.data_bytes
        for name, tensor in zip(names, tensors, strict=True):
            nbytes = tensor.numel() * tensor.element_size()
            out[name] = {"dtype": SAFETENSORS_DTYPES[tensor.dtype], "shape": list(tensor.shape),
                         "data_offsets": [offset, offset + nbytes]}
            offset += nbytes
        return out

    def append(self, names: list[str], tensors: list[torch.Tensor]) -> None:
        """The tensors' bytes written in pieces, each hashed on the hasher's thread meanwhile; returns once
        both are done (the tensors may then be reused)."""
        entries = self._entries(names, tensors)
        for tensor in tensors:
            data = memoryview(tensor.contiguous().view(torch.uint8).numpy()).cast("B")
            for start in range(0, len(data), WRITE_CHUNK):
                piece = data[start:start + WRITE_CHUNK]
                self.hasher.update(piece)
                while piece:  # a raw write may take part of a buffer
                    piece = piece[self.fh.write(piece):]
        self.hasher.wait()
        self.entries.update(entries)
        self.header_used += _header_size(entries)
        self.data_bytes = next(reversed(entries.values()))["data_offsets"][1]

    def finish(self, fingerprint_: str) -> tuple[int, str]:
        """Write the header into its reserved room, fsync; the file's size and checksum."""
        header = json.dumps({"__metadata__": {FINGERPRINT_KEY: fingerprint_}, **self.entries},
                            separators=(",", ":")).encode()
        if len(header) > self.header_bytes:
            raise AssertionError(f"{self.tmp}: header of {len(header)} bytes outgrew its {self.header_bytes}")
        head = self.header_bytes.to_bytes(8, "little") + header.ljust(self.header_bytes, b" ")
        written = 0
        while written < len(head):  # like write(), pwrite may take part of the buffer
            done = os.pwrite(self.fh.fileno(), head[written:], written)
            if done == 0:
                raise OSError(f"{self.tmp}: the header's write made no progress ({written} of {len(head)} bytes)")
            written += done
        self.hasher.update(head)
        os.fsync(self.fh.fileno())
        self.fh.close()
        return 8 + self.header_bytes + self.data_bytes, self.hasher.hexdigest()

    def discard(self) -> None:
        self.fh.close()
        self.tmp.unlink(missing_ok=True)
        self.hasher.hexdigest()  # drop what was hashed of it


class ShardStore(HiddenStateStore):
    layout = "shards"

    def __init__(self, folder: Path, fingerprint: str, shard_mb: int = 1024, storage: str = "bf16"):
        super().__init__(folder, fingerprint, storage)
        self.shard_bytes = shard_mb * 2**20
        self.index_path = folder / "index.jsonl"
        (folder / "shards").mkdir(exist_ok=True)

    def entries(self) -> list[dict]:
        """Index lines whose shard file is in place (a line cut by a kill is dropped)."""
        out = []
        for entry in jsonl.read_appended(self.index_path):
            shard = self.folder / "shards" / entry["shard"]
            if shard.exists() and shard.stat().st_size == entry["bytes"]:
                out.append(entry)
        return out

    def _current(self) -> dict[int, tuple[str, str]]:
        """row -> (shard, token-id digest) for rows stored with this fingerprint (latest wins)."""
        rows: dict[int, tuple[str, str]] = {}
        for entry in self.entries():
            if entry["fingerprint"] == self.fingerprint:
                for row, digest in entry["rows"].items():
                    rows[int(row)] = (entry["shard"], digest)
        return rows

    def done(self, rows: list[list[int]]) -> set[int]:
        current = self._current()
        return {i for i, ids in enumerate(rows) if i in current and current[i][1] == ids_digest(ids)}

    def writer(self) -> Writer:
        return _ShardWriter(self)

    def read(self, row: int) -> dict[str, torch.Tensor]:
        shard, _ = self._current()[row]
        with safe_open(self.folder / "shards" / shard, framework="pt") as fh:
            return _read(fh, f"{row}.")

    def locations(self, rows: list[int]) -> list[tuple[str, str]]:
        current = self._current()
        return [(str(self.folder / "shards" / current[r][0]), f"{r}.") for r in rows]

    def describe(self) -> dict:
        """The shards this fingerprint's rows are in, each with the index line that wrote it (the
        latest of this fingerprint: a stale line under the same name never vouches for a new file)."""
        used = {shard for shard, _ in self._current().values()}
        written = {e["shard"]: e for e in self.entries() if e["fingerprint"] == self.fingerprint}
        shards = [{"shard": e["shard"], "bytes": e["bytes"], "rows": len(e["rows"]),
                   **{k: e[k] for k in (CHECKSUM, "sha256") if k in e}} for name, e in written.items() if name in used]
        return {"layout": self.layout, "files": len(shards), "bytes": sum(s["bytes"] for s in shards),
                "shards": shards}

    def damaged(self, full: bool = True) -> list[Path]:
        """Shards in use whose size (and checksum, when ``full``) differ from their index entry."""
        shards = [(self.folder / "shards" / s["shard"], s) for s in self.describe()["shards"]]
        return [p for p, s in shards
                if not p.exists() or p.stat().st_size != s["bytes"] or (full and not _checksum_matches(p, s))]

    def verify(self, full: bool = True) -> None:
        for path in self.damaged(full)[:1]:
            raise OSError(f"{path}: does not match its index entry (size or checksum); it is corrupt. Rerun the "
                          f"dataset's hidden_states job (snakemake --forcerun {self.folder}/manifest.json): it "
                          "re-extracts the rows of damaged shards only")

    def drop_damaged(self, full: bool = True) -> list[Path]:
        """Delete damaged shards so that their rows count as missing and are extracted again."""
        bad = self.damaged(full)
        for path in bad:
            path.unlink(missing_ok=True)
        return bad

    def purge_stale(self) -> int:
        used = {shard for shard, _ in self._current().values()}
        freed = 0
        for path in (self.folder / "shards").glob("shard_*.safetensors"):
            if path.name not in used:
                freed += path.stat().st_size
                path.unlink()
        for tmp in (self.folder / "shards").glob("*.partial"):
            tmp.unlink()
        return freed

    def next_shard_name(self) -> str:
        """A name no file and no index line ever had: the lines of purged or damaged shards stay in
        the index, and a new shard of the same name and size would be checked against them."""
        taken = [int(p.stem.split("_")[1]) for p in (self.folder / "shards").glob("shard_*.safetensors")]
        taken += [int(e["shard"].split("_")[1].split(".")[0]) for e in jsonl.read_appended(self.index_path)]
        return f"shard_{max(taken, default=-1) + 1:06d}.safetensors"


def _aligned(nbytes: int) -> int:
    return -(-nbytes // PinnedPool.ALIGN) * PinnedPool.ALIGN


class PinnedPool:
    """Page-locked host memory for rows on their way from an accelerator: one block of ``capacity``
    bytes, allocated once, handed out as a ring. torch's pinned allocator gives every request its own
    block rounded up to a power of two and keeps freed blocks for the process's life, so staging each
    row of mixed lengths in a block of its own grew page-locked memory past the queue's bound. Blocks
    are released in the order they were taken (the writer thread stores rows in order); ``take``
    waits while the ring is full, and returns None for a row larger than the whole pool (copied
    without it). ``pin``: False only where a test runs the pool on a machine without an accelerator."""

    ALIGN = 512  # every block and every tensor in it starts here: any dtype's view is aligned

    def __init__(self, capacity: int, pin: bool = True):
        self.capacity = capacity
        self.buffer = torch.empty(capacity, dtype=torch.uint8, pin_memory=pin)
        self.live: deque[tuple[int, int]] = deque()  # (offset, bytes) in the order taken
        self.changed = threading.Condition()
        self.peak = 0

    def _offset(self, nbytes: int) -> int | None:
        if not self.live:
            return 0
        tail = self.live[0][0]  # the oldest block's start
        head = self.live[-1][0] + self.live[-1][1]  # the newest block's end
        if head > tail:  # free: after head, and before tail once wrapped
            if head + nbytes <= self.capacity:
                return head
            return 0 if nbytes <= tail else None
        return head if head + nbytes <= tail else None  # wrapped: free between head and tail

    def take(self, nbytes: int) -> torch.Tensor | None:
        size = _aligned(nbytes)
        if size > self.capacity:
            return None
        with self.changed:
            self.changed.wait_for(lambda: self._offset(size) is not None)
            offset = self._offset(size)
            self.live.append((offset, size))
            self.peak = max(self.peak, sum(n for _, n in self.live))
        return self.buffer[offset:offset + nbytes]

    def release(self) -> None:
        """The oldest block taken is free again."""
        with self.changed:
            self.live.popleft()
            self.changed.notify_all()


class _Staged:
    """A row on its way to the host. Tensors on a device with pinned staging
    (:func:`draftsmith.core.platform.pinned_staging`) are copied into the writer's :class:`PinnedPool`
    without waiting (no sync per row); an event recorded after the copies tells the writer thread when
    it may read them. A CPU's tensors are taken as they are, another device's copied at once."""

    def __init__(self, tensors: dict[str, torch.Tensor], pool_for: Callable[[], PinnedPool]):
        self.event = None
        self.pool: PinnedPool | None = None
        staged = {name: t for name, t in tensors.items() if platform.pinned_staging(t.device.type)}
        # another accelerator's tensors (XPU, MPS) are copied to the host now, waiting for them
        self.tensors = {name: t.to("cpu").contiguous() for name, t in tensors.items() if name not in staged}
        if staged:
            sizes = [_aligned(t.numel() * t.element_size()) for t in staged.values()]
            pool = pool_for()
            block = pool.take(sum(sizes))
            if block is None:  # larger than the whole pool: copied now, without page-locked memory
                self.tensors.update({name: t.to("cpu") for name, t in staged.items()})
            else:
                self.pool, offset = pool, 0
                for (name, tensor), size in zip(staged.items(), sizes, strict=True):
                    host = block[offset:offset + tensor.numel() * tensor.element_size()]
                    host = host.view(tensor.dtype).view(tensor.shape)
                    host.copy_(tensor, non_blocking=True)
                    self.tensors[name] = host
                    offset += size
                device = next(iter(staged.values())).device.type
                self.event = getattr(torch, device).Event(**platform.staging_event_options(device))
                self.event.record()  # after the copies, on the stream that computed the states
        self.nbytes = sum(t.numel() * t.element_size() for t in self.tensors.values())

    def on_host(self) -> dict[str, torch.Tensor]:
        if self.event is not None:
            self.event.synchronize()
        return self.tensors

    def release(self) -> None:
        """The writer is done with the tensors: their pinned block goes back to the pool."""
        if self.pool is not None:
            self.pool.release()
            self.pool = None


class _ShardWriter(Writer):
    """Rows go into a queue bounded by bytes (:data:`QUEUE_BYTES`), and one thread streams them into
    shard files: the extraction computes the next rows while storage takes the last ones, and waits
    for storage only when storage is the limit. A failure of the thread (a full disk) is raised by the
    next ``write`` or by ``close``."""

    def __init__(self, store: ShardStore):
        self.store = store
        # room for the header: ~2 MiB for a 1 GiB shard, i.e. ~15,000 tensors (~7,000 rows); with its 8-byte
        # length, a whole number of pages, so the tensors' bytes start page-aligned in the file (the
        # kernel's copy into the page cache is slower to a misaligned destination: ~5% on an AMD EPYC)
        self.header_bytes = min(max(4 << 10, store.shard_bytes // 512), 8 << 20) // 4096 * 4096 - 8
        self.queue: queue.Queue = queue.Queue()
        self.room = threading.Condition()
        self.queued_bytes = 0
        self.error: BaseException | None = None
        self.shard: _ShardFile | None = None
        self.rows: dict[str, str] = {}
        self.pool: PinnedPool | None = None  # made for the first row that needs it
        self.hasher = _Hasher()
        self.thread = threading.Thread(target=self._drain, name="shard-writer", daemon=True)
        self.thread.start()

    def _pool(self) -> PinnedPool:
        if self.pool is None:
            self.pool = PinnedPool(PINNED_BYTES)
        return self.pool

    def _raise(self) -> None:
        if self.error is not None:
            raise OSError(f"{self.store.folder}: writing a shard failed: {self.error}") from self.error

    def write(self, row: int, hidden_states: torch.Tensor, token_ids: torch.Tensor) -> None:
        self._raise()
        ids = token_ids.to("cpu", torch.int64)
        staged = _Staged({**encode(hidden_states, self.store.storage), "token_ids": ids}, self._pool)
        with self.room:
            self.room.wait_for(lambda: self.error is not None or self.queued_bytes == 0
                               or self.queued_bytes + staged.nbytes <= QUEUE_BYTES)
            self.queued_bytes += staged.nbytes
        self._raise()
        self.queue.put((row, staged))

    def _drain(self) -> None:
        while (item := self.queue.get()) is not None:
            row, staged = item
            try:
                if self.error is None:
                    tensors = staged.on_host()
                    self._append(row, ids_digest(tensors["token_ids"].tolist()), tensors)
            except BaseException as err:  # raised in the extraction's thread, by write or close
                self.error = err
            finally:
                staged.release()
                with self.room:
                    self.queued_bytes -= staged.nbytes
                    self.room.notify_all()

    def _append(self, row: int, digest: str, tensors: dict[str, torch.Tensor]) -> None:
        names, values = [f"{row}.{name}" for name in tensors], list(tensors.values())
        if self.shard is not None and not self.shard.fits(names, values):
            self.flush()
        if self.shard is None:
            tmp = self.store.folder / "shards" / f"writing.{os.getpid()}.{threading.get_ident()}.partial"
            self.shard = _ShardFile(tmp, self.header_bytes, self.hasher)
        self.shard.append(names, values)
        self.rows[str(row)] = digest
        if self.shard.data_bytes >= self.store.shard_bytes:
            self.flush()

    def flush(self) -> None:
        """The shard in progress renamed into place, then its index line: a kill before the line
        leaves a file no line vouches for, which the next run deletes."""
        if self.shard is None:
            return
        size, checksum = self.shard.finish(self.store.fingerprint)
        name = self.store.next_shard_name()
        os.replace(self.shard.tmp, self.store.folder / "shards" / name)
        jsonl.append(self.store.index_path, [{"shard": name, "rows": self.rows, "fingerprint": self.store.fingerprint,
                                              "bytes": size, CHECKSUM: checksum}])
        self.shard, self.rows = None, {}

    def close(self) -> None:
        self.queue.put(None)
        self.thread.join()
        try:
            if self.error is None:
                self.flush()
            elif self.shard is not None:
                self.shard.discard()
        finally:
            self.hasher.close()
        self._raise()


def open_store(folder: Path, fingerprint_: str, layout: str, shard_mb: int = 1024,
               storage: str = "bf16") -> HiddenStateStore:
    if layout == "per_row":
        return PerRowStore(folder, fingerprint_, storage)
    if layout == "shards":
        return ShardStore(folder, fingerprint_, shard_mb, storage)
    raise ValueError(f"unknown hidden-state layout {layout!r}")


# --- the training side -------------------------------------------------------------------------

INDEX_NAME = "hs_locations.json"


def write_locations(data_dir: Path, locations: list[tuple[str, str]]) -> None:
    """Where merged row ``i``'s states are, relative to the training data folder (portable)."""
    rel = [(os.path.relpath(path, data_dir), prefix) for path, prefix in locations]
    (data_dir / INDEX_NAME).write_text(json.dumps(rel))


class ShardTransfer(HiddenStatesTransfer):
    """Reads a merged row's states from wherever its dataset's store put them (either layout)."""

    def __init__(self, data_path: Path, max_open: int = 8):
        self.data_path = Path(data_path)
        self.max_open = max_open
        self._locations: list[tuple[str, str]] | None = None
        self._open: OrderedDict[str, Any] = OrderedDict()

    def __getstate__(self) -> dict:  # file handles stay in their process (dataloader workers are spawned)
        return {"data_path": self.data_path, "max_open": self.max_open, "_locations": None, "_open": OrderedDict()}

    def _handle(self, path: str):
        """An open file and its tensor names (a shard holds thousands: looked up once)."""
        if path not in self._open:
            if len(self._open) >= self.max_open:
                self._open.popitem(last=False)
            fh = safe_open(path, framework="pt")
            self._open[path] = (fh, set(fh.keys()))
        self._open.move_to_end(path)
        return self._open[path]

    def get_cached(self, file_idx: int) -> dict[str, torch.Tensor] | None:
        if self._locations is None:
            self._locations = json.loads((self.data_path / INDEX_NAME).read_text())
        rel, prefix = self._locations[file_idx]
        fh, keys = self._handle(str(self.data_path / rel))
        return _read(fh, prefix, keys)

    def get_generated(self, hs_transfer_params: dict[str, Any]) -> dict[str, torch.Tensor] | None:
        raise RuntimeError("offline hidden states: nothing is generated while training")


BACKEND = "draftsmith"

if BACKEND not in HiddenStatesBackend.registry:
    @HiddenStatesBackend.register(BACKEND)
    class StoreBackend(HiddenStatesBackend):
        """speculators' trainer reads draftsmith's stores (``--hidden-states-backend draftsmith``)."""

        @staticmethod
        def add_train_args(parser) -> None:
            pass

        @staticmethod
        def add_launch_args(parser) -> None:
            pass

        @staticmethod
        def from_train_args(args, data_path: str) -> ShardTransfer:
            return ShardTransfer(Path(data_path))

        @staticmethod
        def build_kv_transfer_config(args) -> dict[str, Any]:
            raise NotImplementedError("draftsmith extracts hidden states itself")
