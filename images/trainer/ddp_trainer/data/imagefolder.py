"""S3ImageFolder: torchvision's ImageFolder over an S3 prefix, one GET per item.

`<prefix>/<class>/**/<file>.<image ext>`; classes, class_to_idx, samples and targets follow
torchvision.datasets.ImageFolder exactly (sorted classes, per-class files in os.walk order).
The prefix is listed once, in the constructing process; DataLoader workers receive the listing
with the pickled dataset and open their own S3 client.
"""

from __future__ import annotations

import io
import posixpath
from collections.abc import Callable, Sequence
from typing import Any

from torch.utils.data import Dataset

from ..errors import ConfigError, CorruptDataError
from ..storage import s3

IMG_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")


def pil_loader(data: bytes, key: str = "<bytes>") -> Any:
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(io.BytesIO(data)) as image:
            return image.convert("RGB")
    except (UnidentifiedImageError, OSError, ValueError) as exc:
        raise CorruptDataError(f"decoding image {key}: {exc}") from exc


def _walk_order(relative_key: str) -> tuple[str, str]:
    """Sort key reproducing `sorted(os.walk(class_dir))` then `sorted(fnames)`."""
    return posixpath.dirname(relative_key), posixpath.basename(relative_key)


def make_samples(
    keys: Sequence[str],
    prefix: str,
    extensions: Sequence[str] | None = IMG_EXTENSIONS,
    is_valid_file: Callable[[str], bool] | None = None,
) -> tuple[list[str], dict[str, int], list[tuple[str, int]]]:
    """From object keys under `prefix`, build (classes, class_to_idx, samples) like ImageFolder."""
    if (extensions is None) == (is_valid_file is None):
        raise ValueError("pass exactly one of extensions and is_valid_file")
    lowered = tuple(e.lower() for e in extensions) if extensions is not None else ()

    def valid(key: str) -> bool:
        return is_valid_file(key) if is_valid_file is not None else key.lower().endswith(lowered)

    base = prefix.strip("/") + "/" if prefix.strip("/") else ""
    by_class: dict[str, list[str]] = {}
    for key in keys:
        if not key.startswith(base):
            continue
        relative = key[len(base) :]
        class_name, sep, rest = relative.partition("/")
        if not sep or not class_name:
            continue  # objects directly under the prefix are not samples, as in ImageFolder
        files = by_class.setdefault(class_name, [])
        if rest and not rest.endswith("/") and valid(key):
            files.append(rest)
    classes = sorted(by_class)
    if not classes:
        raise ConfigError(f"no class folders found under {prefix!r}")
    class_to_idx = {name: i for i, name in enumerate(classes)}
    empty = [c for c in classes if not by_class[c]]
    if empty:
        wanted = ", ".join(lowered) if extensions is not None else "is_valid_file"
        raise ConfigError(f"found no valid file for the classes {', '.join(empty)} under {prefix!r} ({wanted})")
    samples = [
        (base + class_name + "/" + rest, class_to_idx[class_name])
        for class_name in classes
        for rest in sorted(by_class[class_name], key=_walk_order)
    ]
    return classes, class_to_idx, samples


def _one_of(ours: str | None, theirs: str | None, name: str, their_name: str) -> str:
    """A value given under our name or dask-pytorch-ddp's, not both and not neither."""
    if (ours is None) == (theirs is None):
        raise TypeError(f"S3ImageFolder needs {name} (or dask-pytorch-ddp's {their_name}), exactly once")
    return ours if ours is not None else str(theirs)


class S3ImageFolder(Dataset[tuple[Any, Any]]):
    """Map-style dataset: `dataset[i] -> (transform(image), target_transform(class index))`.

    `samples` holds (key, class index) pairs; keys are full object keys in `bucket`. dask-pytorch-ddp's
    keywords work too: `S3ImageFolder(s3_bucket=..., s3_prefix=..., transform=..., anon=True)`;
    `anon`: unsigned requests, for public buckets. Its attributes `s3_bucket`, `s3_prefix` and
    `all_files` (every sample's key) are here as well.
    """

    def __init__(
        self,
        bucket: str | None = None,
        prefix: str | None = None,
        transform: Callable[[Any], Any] | None = None,
        target_transform: Callable[[int], Any] | None = None,
        loader: Callable[[bytes, str], Any] = pil_loader,
        extensions: Sequence[str] | None = IMG_EXTENSIONS,
        is_valid_file: Callable[[str], bool] | None = None,
        *,
        s3_bucket: str | None = None,
        s3_prefix: str | None = None,
        anon: bool = False,
    ) -> None:
        self.bucket = _one_of(bucket, s3_bucket, "bucket", "s3_bucket")
        self.prefix = _one_of(prefix, s3_prefix, "prefix", "s3_prefix").strip("/")
        self.anon = anon
        self.transform = transform
        self.target_transform = target_transform
        self.loader = loader
        if is_valid_file is not None:
            extensions = None
        keys = [key for key, _ in s3.list_objects(s3.S3Url(self.bucket, self.prefix), s3.client(unsigned=anon))]
        where = f"s3://{self.bucket}/{self.prefix}"
        try:
            self.classes, self.class_to_idx, self.samples = make_samples(keys, self.prefix, extensions, is_valid_file)
        except ConfigError as exc:
            raise ConfigError(str(exc).replace(repr(self.prefix), where)) from None
        self.targets = [target for _, target in self.samples]
        self.imgs = self.samples

    @property
    def s3_bucket(self) -> str:
        return self.bucket

    @property
    def s3_prefix(self) -> str:
        return self.prefix

    @property
    def all_files(self) -> list[str]:
        return [key for key, _ in self.samples]

    @classmethod
    def from_uri(cls, uri: str, **kwargs: Any) -> S3ImageFolder:
        url = s3.parse_uri(uri)
        return cls(url.bucket, url.key, **kwargs)

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> tuple[Any, Any]:
        key, target = self.samples[index]
        url = s3.S3Url(self.bucket, key)
        sample = self.loader(s3.get_bytes(url, s3.client(unsigned=self.anon)), str(url))
        if self.transform is not None:
            try:
                sample = self.transform(sample)
            except Exception as error:
                error.add_note(f"in the image {url}")
                raise
        if self.target_transform is not None:
            target = self.target_transform(target)
        return sample, target

    def __repr__(self) -> str:
        return f"S3ImageFolder(s3://{self.bucket}/{self.prefix}, {len(self)} samples, {len(self.classes)} classes)"
