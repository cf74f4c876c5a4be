"""Image rows: recognised, every image checked before any model loads, and handed to TRL's vision collator.

Two shapes of row carry images (TRL's own vision formats):
- messages whose content is a list of parts, an image part being `{"type": "image", "image": PATH}` (a path
  relative to the dataset's folder, or absolute outside public mode);
- LLaVA-style: an `images` column (a list of paths, or images a Hub dataset decoded) beside `messages`, whose image
  parts are placeholders (`{"type": "image"}`) filled in order; messages whose contents are plain text get the images
  before the first user turn, as TRL does.

Every image is opened before training and each problem is said with its row (1-based, as the preview counts):
missing, a web address (read from the dataset's folder only), unreadable, too large, animated (only the first frame
would train), CMYK (its colours would change in a conversion without its colour profile), a placeholder count that
differs from the images given. All of them at once, in one DataError (`data.err.images`), so a user fixes the file in
one go. EXIF rotation is applied, as image viewers show the photo (`ImageOps.exif_transpose`), and counted.

`plan_images` is the vision run's plan: every row kept (images are never cut: a row whose tokens pass max_length is
dropped and counted), its tokens counted with the processor's own resizing (image tokens apart), and
`train_dataset()` the rows TRL's DataCollatorForVisionLanguageModeling reads (images opened as each batch is made).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from core.data.formats import ROLES, column_values
from core.data.read import DataError, is_local
from core.messages import Said

MAX_PIXELS = 50_000_000  # an image past this is refused (PIL's own decompression-bomb warning starts at 89 MP)
MAX_IMAGE_BYTES = 64 * 2**20
MAX_SAID = 50  # problems listed in the refusal; the rest are counted
IMAGE_COLUMNS = ("images", "image")


def has_images(raw: Any) -> bool:
    """Rows that carry images: an images/image column beside messages, or an image part in the first rows'
    messages."""
    columns = set(raw.column_names)
    if "messages" not in columns:
        return False
    if columns & set(IMAGE_COLUMNS):
        return True
    for messages in column_values(raw, "messages")[:100]:
        if any(_image_parts(m) for m in (messages or []) if isinstance(m, dict)):
            return True
    return False


def _image_parts(message: dict[str, Any]) -> list[dict[str, Any]]:
    content = message.get("content")
    return [p for p in content if isinstance(p, dict) and p.get("type") == "image"] if isinstance(content, list) else []


def images_folder(source: str) -> Path | None:
    """The folder relative image paths are read from: the dataset's folder (a local file's parent)."""
    if not is_local(source):
        return None
    path = Path(source).expanduser().resolve()
    return path if path.is_dir() else path.parent


@dataclass
class ImageRow:
    """One row as TRL's vision collator reads it: messages with image placeholders and text parts, and its images
    (paths to open, or images already decoded), in the placeholders' order."""

    messages: list[dict[str, Any]]
    images: list[Any]


@dataclass
class Checked:
    """The rows, and what the check found: the problems (said), and how many images were turned upright."""

    rows: list[ImageRow]
    problems: list[Said] = field(default_factory=list)
    rotated: int = 0


def check_images(raw: Any, folder: Path | None, public: bool = False) -> Checked:
    """Every row read and every image opened (never decoded whole): the rows, and every problem with its row."""
    columns = [c for c in IMAGE_COLUMNS if c in raw.column_names]
    given = column_values(raw, columns[0]) if columns else [None] * len(raw)
    checked = Checked([])
    for index, (messages, images) in enumerate(zip(column_values(raw, "messages"), given)):
        n = index + 1
        row = _row(messages, images, n, checked.problems)
        if row is None:
            continue
        for i, image in enumerate(row.images):
            opened = _open(image, folder, public, n, checked.problems)
            if opened is not None:
                row.images[i], turned = opened
                checked.rotated += turned
        checked.rows.append(row)
    return checked


def _row(messages: Any, images: Any, n: int, problems: list[Said]) -> ImageRow | None:
    """The row's messages as TRL's parts and its images in order; None (and a problem) for a row that is no
    conversation."""
    if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
        problems.append(Said("data.img.not_messages", n=n))
        return None
    if images is not None and not isinstance(images, list):
        images = [images]
    out, found = [], []
    for message in messages:
        role = ROLES.get(str(message.get("role", message.get("from"))).strip().lower(), "user")
        content = message.get("content", message.get("value"))
        if isinstance(content, list):
            parts = []
            for part in content:
                if not isinstance(part, dict):
                    continue
                if part.get("type") == "image":
                    parts.append({"type": "image"})
                    found.append(part.get("image") or part.get("path") or part.get("url"))
                elif part.get("text"):
                    parts.append({"type": "text", "text": str(part["text"])})
        else:
            parts = [{"type": "text", "text": "" if content is None else str(content)}]
        out.append({"role": role, "content": parts})
    if images:  # LLaVA-style: the images column fills the placeholders
        if found and len(found) != len(images):
            problems.append(Said("data.img.count", n=n, images=len(images), parts=len(found)))
            return None
        if not found:  # plain-text turns: the images go before the first user turn's text, as TRL puts them
            first = next((m for m in out if m["role"] == "user"), out[0] if out else None)
            if first is None:
                problems.append(Said("data.img.not_messages", n=n))
                return None
            first["content"] = [{"type": "image"} for _ in images] + first["content"]
        found = list(images)
    elif any(f is None for f in found):
        problems.append(Said("data.img.no_image", n=n))
        return None
    return ImageRow(out, found)


def _open(image: Any, folder: Path | None, public: bool, n: int, problems: list[Said]) -> tuple[Any, bool] | None:
    """(the image to train on, whether EXIF turned it) or None with a problem: a path is checked, opened, its header
    read; an image a Hub dataset decoded is checked as it is."""
    from PIL import Image, UnidentifiedImageError

    if isinstance(image, dict):  # datasets' undecoded Image feature
        image = image.get("path") or image.get("bytes")
    if isinstance(image, Image.Image):
        return (image, False) if _acceptable(image, str(n), n, problems) else None
    if not isinstance(image, str) or not image.strip():
        problems.append(Said("data.img.no_image", n=n))
        return None
    name = image.strip()
    if name.startswith(("http://", "https://")):
        problems.append(Said("data.img.url", n=n, image=name))
        return None
    path = Path(name).expanduser()
    if not path.is_absolute():
        if folder is None:
            problems.append(Said("data.img.no_folder", n=n, image=name))
            return None
        path = folder / path
    path = path.resolve()
    if public and (folder is None or not path.is_relative_to(folder)):
        problems.append(Said("data.img.outside", n=n, image=name))
        return None
    if not path.is_file():
        problems.append(Said("data.img.missing", n=n, image=name, path=str(path)))
        return None
    if path.stat().st_size > MAX_IMAGE_BYTES:
        problems.append(Said("data.img.too_large_file", n=n, image=name, mib=round(path.stat().st_size / 2**20, 1),
                             max=MAX_IMAGE_BYTES // 2**20))
        return None
    try:
        with Image.open(path) as opened:
            if not _acceptable(opened, name, n, problems):
                return None
            opened.verify()  # the whole file read once, nothing decoded into memory
            turned = _orientation(opened) not in (None, 1)
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError, Image.DecompressionBombError) as exc:
        problems.append(Said("data.img.unreadable", n=n, image=name, error=f"{type(exc).__name__}: {exc}"))
        return None
    return str(path), turned


def _acceptable(image: Any, name: str, n: int, problems: list[Said]) -> bool:
    width, height = image.size
    if width * height > MAX_PIXELS:
        problems.append(Said("data.img.too_large", n=n, image=name, width=width, height=height,
                             max=f"{MAX_PIXELS / 1e6:g}"))
        return False
    if getattr(image, "is_animated", False) and getattr(image, "n_frames", 1) > 1:
        problems.append(Said("data.img.animated", n=n, image=name, frames=image.n_frames))
        return False
    if image.mode == "CMYK":
        problems.append(Said("data.img.cmyk", n=n, image=name))
        return False
    return True


def _orientation(image: Any) -> int | None:
    try:
        return image.getexif().get(0x0112)  # EXIF Orientation
    except Exception:  # noqa: BLE001 - a damaged EXIF block: the image is read as stored
        return None


def load_image(image: Any) -> Any:
    """The image as training sees it: upright as EXIF says, RGB (what every image processor converts to)."""
    from PIL import Image, ImageOps

    if not isinstance(image, Image.Image):
        with Image.open(image) as opened:
            image = ImageOps.exif_transpose(opened)
            image.load()
    return image.convert("RGB") if image.mode != "RGB" else image


def refuse(checked: Checked, where: str) -> None:
    """One DataError naming every problem (the first MAX_SAID, the rest counted), or nothing."""
    if not checked.problems:
        return
    more = len(checked.problems) - MAX_SAID
    lines = checked.problems[:MAX_SAID] + ([Said("data.img.more", n=more)] if more > 0 else [])
    raise DataError("data.err.images", where=where, n=len(checked.problems), lines=lines)


# --- the plan -----------------------------------------------------------------------------------------------------
def opened(row: ImageRow) -> dict[str, Any]:
    """A row as TRL's vision collator reads it: {"messages", "images"}, its images opened (upright, RGB)."""
    return {"messages": [dict(m, content=[dict(p) for p in m["content"]]) for m in row.messages],
            "images": [load_image(image) for image in row.images]}


def vision_rows(rows: list[ImageRow]) -> Any:
    """The rows as a datasets.Dataset (what TRL's SFTTrainer takes) of row numbers, each row opened by its transform
    as a batch is made: images are read from disk then, never all held in memory."""
    import datasets

    dataset = datasets.Dataset.from_dict({"row": list(range(len(rows)))})

    def transform(batch: dict[str, list[Any]]) -> dict[str, list[Any]]:
        items = [opened(rows[i]) for i in batch["row"]]
        return {"messages": [it["messages"] for it in items], "images": [it["images"] for it in items]}

    dataset = dataset.with_transform(transform)
    dataset.memtune_images = True  # core/train/vision.is_vision: the trainer to build
    return dataset


@dataclass
class VisionPlan:
    """A vision run's rows, as a text run's DataPlan tells its own: which train (none is cut: a row past max_length
    is dropped), their tokens (text and image tokens, the processor's own count) and the lines the log says."""

    source: str
    max_length: int
    n_source: int
    rows: list[ImageRow]
    lengths: list[int]
    image_tokens: list[int]
    rotated: int = 0
    format: str = "messages+images"
    long_prompts: str = "drop"
    packing: bool = False
    n_packs: int | None = None
    notes: list[Said] = field(default_factory=list)
    examples: list[dict[str, Any]] = field(default_factory=list)
    held: Any = None
    validation: Any = None
    turns: dict[str, int] | None = None
    heldout: VisionPlan | None = None  # validation_data's image rows: answered before and after training
    images: bool = True  # a vision run's plan (core/model/resolve.py turns packing off for it)

    @property
    def kept(self) -> list[int]:
        return [i for i, n in enumerate(self.lengths) if n <= self.max_length]

    @property
    def n_train(self) -> int:
        return len(self.kept)

    @property
    def counts(self) -> dict[str, int]:
        return {"kept": self.n_train, "truncated": 0, "prompt_cut": 0, "dropped_long": len(self.lengths) - self.n_train,
                "dropped_empty": self.n_source - len(self.lengths)}

    @property
    def evaluates(self) -> bool:
        return False

    @property
    def longest_row(self) -> int:
        return max(self.lengths, default=0)

    @property
    def multi_turn(self) -> bool:
        return False

    def validation_dict(self) -> None:
        return None

    def to_dict(self) -> dict[str, Any]:
        return {"format": self.format, "rows_in_split": self.n_source, "train_rows": self.n_train, **self.counts,
                "packs": None, "max_length": self.max_length, "turns": None, "long_prompts": self.long_prompts,
                "longest_row_tokens": self.longest_row, "images": sum(len(r.images) for r in self.rows),
                "image_tokens": sum(self.image_tokens), "rotated_images": self.rotated}

    def describe(self, validation: bool = False) -> Said:
        return Said("log.images", rows=self.n_source, dataset=self.source, train=self.n_train,
                    images=sum(len(r.images) for r in self.rows), image_tokens=sum(self.image_tokens),
                    dropped=self.counts["dropped_long"], max_length=str(self.max_length))

    def log_lines(self) -> list[tuple[str, Said]]:
        return [("info", line) for line in [self.describe(), *self.notes]]

    def refusal(self) -> Said | None:
        if self.n_train:
            return None
        return Said("log.images_refusal", rows=len(self.lengths), max_length=str(self.max_length),
                    longest=self.longest_row)

    def train_dataset(self) -> Any:
        return vision_rows([self.rows[i] for i in self.kept])


def count_tokens(processor: Any, row: ImageRow) -> tuple[int, int]:
    """(tokens, image tokens) of one row as the collator makes it: the processor's chat template and its resizing."""
    item = opened(row)
    out = processor.apply_chat_template([_filled(item)], tokenize=True, return_dict=True)
    ids = out["input_ids"][0]
    # the tokenizer's image token first: Gemma-3's processor names its begin-of-image token image_token_id, where the
    # image's 256 tokens are the tokenizer's image_token (<image_soft_token>)
    image_id = getattr(processor.tokenizer, "image_token_id", None) or getattr(processor, "image_token_id", None)
    return len(ids), sum(1 for t in ids if t == image_id)


def _filled(item: dict[str, Any]) -> list[dict[str, Any]]:
    """The messages with each placeholder holding its image, as TRL's prepare_multimodal_messages fills them."""
    images = iter(item["images"])
    return [dict(m, content=[dict(p, image=next(images)) if p["type"] == "image" else p for p in m["content"]])
            for m in item["messages"]]


def plan_images(source: str, max_length: int, processor: Any, raw: Any, where: str, public: bool = False) -> VisionPlan:
    """The vision run's plan: every image checked (all problems at once), every row counted with the processor."""
    checked = check_images(raw, images_folder(source), public)
    refuse(checked, where)
    counted = [count_tokens(processor, row) for row in checked.rows]
    plan = VisionPlan(source=where, max_length=max_length, n_source=len(raw), rows=checked.rows,
                      lengths=[n for n, _ in counted], image_tokens=[k for _, k in counted], rotated=checked.rotated)
    if checked.rotated:
        plan.notes.append(Said("log.images_rotated", n=checked.rotated))
    return plan


# --- what the data preview shows of a row -------------------------------------------------------------------------
THUMB_PX = 96  # a preview thumbnail's longest side
THUMB_BYTES = 48 * 2**10  # a thumbnail past this (a noisy photo as PNG) is saved as JPEG instead


def thumbnail(image: Any, px: int = THUMB_PX) -> str:
    """A small copy of a checked image as training sees it (upright, RGB), as a data: address the page shows inline:
    no file of the dataset is ever served, only these bytes, made here from the image the check opened."""
    import base64
    import io

    small = load_image(image).copy()
    small.thumbnail((px, px))
    out = io.BytesIO()
    small.save(out, format="PNG", optimize=True)
    kind = "png"
    if out.tell() > THUMB_BYTES:
        out = io.BytesIO()
        small.save(out, format="JPEG", quality=80)
        kind = "jpeg"
    return f"data:image/{kind};base64,{base64.b64encode(out.getvalue()).decode('ascii')}"


def trained_text(processor: Any, row: ImageRow) -> list[dict[str, Any]]:
    """The row's tokens as the collator makes them, decoded: [{"text": ...} | {"image_tokens": n}], each run of
    image tokens (hundreds on a real model) one entry with its count, the rest the exact text around them."""
    item = opened(row)
    ids = list(processor.apply_chat_template([_filled(item)], tokenize=True, return_dict=True)["input_ids"][0])
    image_id = getattr(processor, "image_token_id", None)
    out: list[dict[str, Any]] = []
    start = 0
    for i in range(len(ids) + 1):
        boundary = i == len(ids) or (i > start and (ids[i] == image_id) != (ids[start] == image_id))
        if not boundary:
            continue
        if start < i:
            out.append({"image_tokens": i - start} if ids[start] == image_id else
                       {"text": processor.tokenizer.decode(ids[start:i], skip_special_tokens=False)})
        start = i
    return out


# --- Try it: a question about one image ----------------------------------------------------------------------------
def question(text: str, image: str | None) -> ImageRow:
    """A user's question as a one-turn row: the image first, then the text, as the demo's and TRL's rows put them."""
    parts = ([{"type": "image"}] if image else []) + [{"type": "text", "text": text}]
    return ImageRow([{"role": "user", "content": parts}], [image] if image else [])


def image_problems(path: str) -> list[Said]:
    """What check_images would say of one image file given by its absolute path (Try it's upload): [] when good."""
    problems: list[Said] = []
    _open(path, None, False, 1, problems)
    return problems


def generation_inputs(processor: Any, row: ImageRow) -> dict[str, Any]:
    """The row's tensors for generate: the processor's chat template with the generation prompt, its images opened
    as training opens them (upright, RGB) and resized by the processor as in training; a row cut before its last
    answer keeps only the images its remaining turns hold."""
    item = opened(row)
    item["images"] = item["images"][:sum(p["type"] == "image" for m in item["messages"] for p in m["content"])]
    return processor.apply_chat_template([_filled(item)], add_generation_prompt=True, tokenize=True,
                                         return_dict=True, return_tensors="pt")
