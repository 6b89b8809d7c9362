"""Frame sequences on disk and their MP4.

``FrameWriter(out_dir)`` writes ``out_dir/frames/frame_00000.png``, ... and, on
``finish()``, encodes them into ``out_dir/video.mp4`` (H.264, yuv420p) with the
ffmpeg binary that ``imageio-ffmpeg`` ships. The PNGs stay, so a crashed or
interrupted run still leaves its frames behind.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

log = logging.getLogger(__name__)


def ffmpeg_exe() -> str | None:
    """Path of the ffmpeg executable imageio-ffmpeg uses, or None when there is none."""
    try:
        import imageio_ffmpeg

        return imageio_ffmpeg.get_ffmpeg_exe()
    except (ImportError, RuntimeError) as exc:
        log.debug("no ffmpeg: %s", exc)
        return None


def even_size(image: np.ndarray) -> np.ndarray:
    """``image`` (H, W, 3) padded by edge replication to even H and W (H.264 with
    yuv420p subsamples chroma 2x2 and rejects odd sizes)."""
    h, w = image.shape[:2]
    ph, pw = h % 2, w % 2
    if ph == 0 and pw == 0:
        return image
    return np.pad(image, ((0, ph), (0, pw), (0, 0)), mode="edge")


class FrameWriter:
    """Writes numbered PNG frames and assembles them into an MP4.

    out_dir: folder (created); frames go to ``out_dir/frames``. fps: frame rate of
    the video, frames per second. video_name: file name of the MP4 in ``out_dir``.
    """

    def __init__(self, out_dir: str | Path, fps: float = 30.0, video_name: str = "video.mp4"):
        if not fps > 0:
            raise ValueError(f"fps must be > 0, got {fps}")
        self.out_dir = Path(out_dir)
        self.frames_dir = self.out_dir / "frames"
        self.frames_dir.mkdir(parents=True, exist_ok=True)
        self.fps = float(fps)
        self.video_path = self.out_dir / video_name
        self.count = 0
        self._size: tuple[int, int] | None = None
        self._finished = False

    def frame_path(self, index: int) -> Path:
        return self.frames_dir / f"frame_{index:05d}.png"

    def write(self, image: np.ndarray) -> Path:
        """Save ``image`` (H, W, 3) uint8, top row first, as the next frame; returns its path."""
        import imageio.v3 as iio

        if self._finished:
            raise RuntimeError("FrameWriter.write after finish()")
        img = np.asarray(image)
        if img.ndim != 3 or img.shape[2] not in (3, 4) or img.dtype != np.uint8:
            raise ValueError(f"expected an (H, W, 3) uint8 image, got {img.shape} {img.dtype}")
        img = img[:, :, :3]
        if self._size is None:
            self._size = img.shape[:2]
        elif img.shape[:2] != self._size:
            raise ValueError(f"frame size changed from {self._size} to {img.shape[:2]}")
        path = self.frame_path(self.count)
        iio.imwrite(path, img)
        self.count += 1
        return path

    def finish(self) -> Path | None:
        """Encode the frames written so far into the MP4; returns its path, or None when
        there are no frames or no ffmpeg (the PNGs are kept either way). Idempotent."""
        if self._finished:
            return self.video_path if self.video_path.exists() else None
        self._finished = True
        if self.count == 0:
            return None
        exe = ffmpeg_exe()
        if exe is None:
            log.warning(
                "ffmpeg not available (install imageio-ffmpeg): no video; frames kept in %s",
                self.frames_dir,
            )
            return None
        import imageio.v3 as iio
        import imageio_ffmpeg

        h, w = self._size
        h2, w2 = h + h % 2, w + w % 2
        writer = imageio_ffmpeg.write_frames(
            str(self.video_path),
            (w2, h2),
            fps=self.fps,
            codec="libx264",
            pix_fmt_in="rgb24",
            pix_fmt_out="yuv420p",
            quality=8,
            macro_block_size=1,  # we pad to even sizes ourselves; never let it rescale
            ffmpeg_log_level="error",
        )
        try:
            writer.send(None)  # start the generator
            for i in range(self.count):
                img = iio.imread(self.frame_path(i))[:, :, :3]
                writer.send(np.ascontiguousarray(even_size(img)))
        except Exception as exc:  # a broken encoder must not lose the run's other outputs
            log.warning("could not encode %s: %s", self.video_path, exc)
            writer.close()
            return None
        writer.close()
        log.info("wrote %s (%d frames at %g fps)", self.video_path, self.count, self.fps)
        return self.video_path


def write_side_by_side(
    panels: list[list[Path]],
    labels: list[list[list[str]]],
    out_dir: str | Path,
    *,
    fps: float,
    video_name: str = "side_by_side.mp4",
    gap: int = 4,
) -> Path | None:
    """One video of several frame sequences next to each other, each panel labelled.

    panels: per panel, its PNG frames in order (all of one size). labels: per panel and
    frame, the lines written on that panel's top-left corner (``tisim.render.text``).
    A panel with fewer frames than the longest (a run that diverged) holds its last
    frame. gap: dark pixels between panels. The composed frames go to
    ``out_dir/frames`` and the MP4 to ``out_dir/video_name``; returns its path (None
    without frames or ffmpeg).
    """
    import imageio.v3 as iio

    from tisim.render.text import draw_text

    panels = [p for p in panels if p]
    if not panels:
        return None
    n = max(len(p) for p in panels)
    writer = FrameWriter(out_dir, fps=fps, video_name=video_name)
    for old in sorted(writer.frames_dir.glob("frame_*.png")):  # a longer earlier video's frames
        old.unlink()
    for i in range(n):
        row = []
        for k, frames in enumerate(panels):
            j = min(i, len(frames) - 1)
            img = iio.imread(frames[j])[:, :, :3]
            lines = labels[k][min(j, len(labels[k]) - 1)] if labels[k] else []
            # large enough to read on a projector: a 24th of the panel's height
            img = draw_text(img, lines, size=max(14, img.shape[0] // 24)) if lines else img
            if row:
                row.append(np.full((img.shape[0], gap, 3), 20, np.uint8))
            row.append(img)
        writer.write(np.concatenate(row, axis=1))
    return writer.finish()


MAX_VIDEO_FPS = 60.0
MIN_VIDEO_SECONDS = 3.0


@dataclass(frozen=True)
class VideoTiming:
    """How a run's frames become a video: every ``stride``-th simulated frame is written,
    played at ``fps`` (at most 60); ``slowdown`` > 1 is slow motion by that factor (video
    seconds per simulated second), stated in the frames' overlay."""

    stride: int
    fps: float
    slowdown: float


def video_timing(sim_fps: float, frames: int, requested_fps: float | None = None) -> VideoTiming:
    """The timing of a video of ``frames`` simulated frames at ``sim_fps`` frames per
    simulated second. Real time when that lasts at least 3 s (subsampled to at most 60
    fps: stride = ceil(sim_fps / 60)); shorter takes play every frame in slow motion, at
    the rate that makes them last 3 s (at most 60 fps). ``requested_fps`` (the scene's
    ``render.fps``) sets the rate instead, every frame written, capped at 60 by a stride."""
    sim_fps = float(sim_fps)
    frames = max(int(frames), 1)
    if requested_fps is not None:
        stride = max(1, math.ceil(float(requested_fps) / MAX_VIDEO_FPS - 1e-9))
        fps = float(requested_fps) / stride
        return VideoTiming(stride, fps, sim_fps / (fps * stride))
    if frames / sim_fps >= MIN_VIDEO_SECONDS - 1e-9:
        stride = max(1, math.ceil(sim_fps / MAX_VIDEO_FPS - 1e-9))
        return VideoTiming(stride, sim_fps / stride, 1.0)
    fps = min(MAX_VIDEO_FPS, frames / MIN_VIDEO_SECONDS)
    # whole frames: the video lasts frames / fps >= 3 s
    return VideoTiming(1, fps, sim_fps / fps)
