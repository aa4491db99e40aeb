"""Tar members -> samples, by webdataset's rules, and decoding of sample fields by extension.

Tar members are grouped by consecutive basename (everything up to the first dot of the file name)
and each sample is a dict ``{"__key__", "__url__", "<ext>": ...}`` with lower-cased extensions and
no leading dot, e.g. ``sample["jpg"]``, ``sample["cls"]``.
"""

from __future__ import annotations

import io
import json
import re
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from ..errors import CorruptDataError
from .tarreader import TarEnd, TarFormatError

IMAGE_EXTENSIONS = {"jpg", "jpeg", "png", "ppm", "pgm", "pbm", "pnm", "bmp", "webp", "tif", "tiff", "gif"}
INT_EXTENSIONS = {"cls", "cls2", "class", "count", "index", "inx", "id"}
TEXT_EXTENSIONS = {"txt", "text", "transcript"}
JSON_EXTENSIONS = {"json", "jsn"}

_KEY_EXT = re.compile(r"^((?:.*/|)[^.]+)[.]([^/]*)$")


def split_name(name: str) -> tuple[str, str] | None:
    """webdataset's base_plus_ext: 'a/b.seg.png' -> ('a/b', 'seg.png')."""
    match = _KEY_EXT.match(name)
    return (match.group(1), match.group(2)) if match else None


def group_members(members: Iterable[tuple[str, Any]], url: str, end: TarEnd | None = None) -> Iterator[dict[str, Any]]:
    """Group (member name, payload) pairs into samples by consecutive key.

    A sample is yielded when the next one's first member arrives (or the members end), so a
    consumer that stops after sample n has pulled one member of sample n + 1 at most. `end`: how
    the members' archive ended (filled in by tar_entries); a last sample with fewer members than the
    one before is whole only where the archive ended with its end-of-archive marker.
    """
    current: dict[str, Any] = {}  # empty until the first member
    key: str | None = None
    previous: list[str] = []  # the member names of the sample before, in tar order
    for name, payload in members:
        # split_name without the regex or a call in the usual case (this runs once per member while
        # streaming): the key ends at the basename's first dot.
        dot = name.find(".", name.rfind("/") + 1)
        if dot > 0 and name[dot - 1] != "/":
            member_key, ext = name[:dot], name[dot + 1 :]
        else:
            parts = split_name(name)
            if parts is None:
                continue
            member_key, ext = parts
        if member_key != key:
            if current:
                previous = list(current)
                yield current
            key = member_key
            current = {"__key__": key, "__url__": url}
        ext = ext.lower()
        if ext in current:
            raise CorruptDataError(f"shard {url}: sample {key!r} has two {ext!r} members")
        current[ext] = payload
    if current:
        names = list(current)
        marked = end is not None and end.marked
        if not marked and len(names) < len(previous) and previous[2:len(names)] == names[2:]:
            # The members of the sample before, cut off part way, and no end-of-archive marker: a
            # shard cut between two members of its last sample, which must not reach a transform as
            # if whole (a bare KeyError). With the marker, the sample just lacks optional members.
            missing = ", ".join(previous[len(names):])
            raise CorruptDataError(f"shard {url}: its last sample {key!r} ends before its {missing} member "
                                   f"(the sample before has them): the shard is cut short")
        yield current


def unreadable_shard(url: str, error: TarFormatError, what: str = "tar") -> CorruptDataError:
    """`shard URL is not a readable tar: ...`, naming the sample whose member was cut short (or,
    for damage in a header, the sample read last)."""
    name = error.member or error.after
    if name is None:
        return CorruptDataError(f"shard {url} is not a readable {what}: {error}")
    parts = split_name(name)
    key = parts[0] if parts else name
    where = "in" if error.member else "after"
    return CorruptDataError(f"shard {url} is not a readable {what}: {error} {where} sample {key!r} (member {name!r})")


def transformed(transform: Callable[[Any], Any], sample: dict[str, Any]) -> Any:
    """transform(sample); an error it raises keeps its type and says which shard and sample it was."""
    try:
        return transform(sample)
    except Exception as error:
        error.add_note(f"in sample {sample.get('__key__')!r} of shard {sample.get('__url__')}")
        raise


def decode(sample: dict[str, Any]) -> dict[str, Any]:
    """Decode by extension like webdataset's `.decode("pil")`: ints, text, JSON, npy, PIL images."""
    out: dict[str, Any] = {}
    for field, value in sample.items():
        if field.startswith("__") or not isinstance(value, (bytes, bytearray)):
            out[field] = value
            continue
        ext = field.rsplit(".", 1)[-1]
        try:
            out[field] = _decode_value(ext, bytes(value))
        except Exception as exc:
            raise CorruptDataError(f"decoding {sample['__key__']}.{field} in shard {sample['__url__']}: {exc}") from exc
    return out


def _decode_value(ext: str, data: bytes) -> Any:
    if ext in INT_EXTENSIONS:
        return int(data)
    if ext in TEXT_EXTENSIONS:
        return data.decode("utf-8")
    if ext in JSON_EXTENSIONS:
        return json.loads(data)
    if ext == "npy":
        import numpy

        return numpy.load(io.BytesIO(data), allow_pickle=False)
    if ext in IMAGE_EXTENSIONS:
        from PIL import Image

        image = Image.open(io.BytesIO(data))
        image.load()
        return image
    return data
