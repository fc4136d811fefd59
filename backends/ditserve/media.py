"""H.264-in-MP4 encoding of generated video frames (PyAV), and decoding for tests and clients.

Both functions are pure: every call builds its own container, codec context and buffers, so they
are safe to call from several worker threads at once (PyAV holds no state shared between calls).
"""
from __future__ import annotations

import io
import numbers
from fractions import Fraction

import av
import numpy as np

ENCODER = "libx264"  # PyAV's wheels bundle FFmpeg built with libx264; crf/preset below are its options
DEFAULT_CRF = 18     # x264's "visually lossless" point; see tests/test_media.py for the measured error
DEFAULT_PRESET = "veryfast"  # 2-2.4x faster than x264's "medium"; files at most ~30% larger
_AVIO_FLAG_READ = 1


def _check_frames(frames: np.ndarray) -> None:
    if not isinstance(frames, np.ndarray) or frames.dtype != np.uint8:
        raise ValueError(f"frames must be a numpy uint8 array, got {type(frames).__name__}"
                         f"{'' if not isinstance(frames, np.ndarray) else ' of ' + str(frames.dtype)}")
    if frames.ndim != 4 or frames.shape[3] != 3:
        raise ValueError(f"frames must have shape [F, H, W, 3] (RGB), got {list(frames.shape)}")
    num, height, width, _ = frames.shape
    if num < 1:
        raise ValueError("frames must hold at least one frame, got F=0")
    # yuv420p stores chroma at half resolution in both directions, so H.264 needs even sizes.
    # Generated sizes are multiples of 16, so an odd size is a caller bug: reject, don't pad.
    if height < 2 or width < 2 or height % 2 or width % 2:
        raise ValueError(f"frame size {width}x{height} (WxH) is not encodable as yuv420p H.264: "
                         "width and height must be even and >= 2")


def encode_mp4(frames: np.ndarray, fps: int, crf: int = DEFAULT_CRF,
               preset: str = DEFAULT_PRESET) -> bytes:
    """Encode RGB frames [F, H, W, 3] uint8 as H.264 (yuv420p, BT.709, limited range) in MP4.

    crf 18 keeps decoded frames close to the input: on smooth generated-looking content the mean
    absolute error measured 1.4-3.3 levels of 255 and the worst pixel 16-36 (tests/test_media.py
    bounds them at 4.5 and 60). Most of it is the 4:2:0 chroma subsampling that every
    browser-playable H.264 needs, which blurs colour across sharp edges. Lower crf = bigger files.

    The moov atom is moved to the front (``+faststart``) so players can start before the whole
    file arrives. The MP4 muxer does that by re-opening its output for reading after writing it;
    ``io_open`` hands it a snapshot of the in-memory buffer, so no temporary file is needed.
    """
    _check_frames(frames)
    if isinstance(fps, bool) or not isinstance(fps, numbers.Integral) or fps < 1:
        raise ValueError(f"fps must be a positive integer, got {fps!r}")
    if isinstance(crf, bool) or not isinstance(crf, numbers.Integral) or not 0 <= crf <= 51:
        raise ValueError(f"crf must be an integer in [0, 51], got {crf!r}")
    try:
        av.codec.Codec(ENCODER, "w")
    except av.codec.codec.UnknownCodecError as e:
        raise RuntimeError(f"the FFmpeg bundled with PyAV {av.__version__} has no {ENCODER} "
                           "encoder; install the PyAV wheel from PyPI (it ships libx264)") from e

    _, height, width, _ = frames.shape
    buf = io.BytesIO()

    def io_open(url: str, flags: int, options: dict) -> io.BytesIO:
        if flags != _AVIO_FLAG_READ:  # the faststart pass only ever reads its own output back
            raise OSError(f"encode_mp4: unexpected open of {url!r} with flags {flags}")
        return io.BytesIO(buf.getvalue())

    with av.open(buf, "w", format="mp4", options={"movflags": "+faststart"},
                 io_open=io_open) as container:
        stream = container.add_stream(ENCODER, rate=Fraction(int(fps)))
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        stream.options = {"crf": str(int(crf)), "preset": preset}
        cc = stream.codec_context  # tag BT.709, matching the conversion below, so players agree
        cc.colorspace = cc.color_primaries = cc.color_trc = 1  # 1 = BT.709 in all three tables
        cc.color_range = 1  # MPEG / limited (16-235)
        for rgb in frames:
            frame = av.VideoFrame.from_ndarray(np.ascontiguousarray(rgb), format="rgb24")
            frame = frame.reformat(format="yuv420p", dst_colorspace="ITU709",
                                   dst_color_range="MPEG")
            container.mux(stream.encode(frame))
        container.mux(stream.encode(None))  # flush delayed frames
    return buf.getvalue()


def decode_mp4(data: bytes) -> tuple[np.ndarray, float]:
    """Decode the first video stream of an MP4 into RGB frames [F, H, W, 3] uint8 and its fps.

    Colour conversion follows the stream's own tags (BT.709 for files from encode_mp4).
    """
    try:
        with av.open(io.BytesIO(data), "r") as container:
            if not container.streams.video:
                raise ValueError("MP4 has no video stream")
            stream = container.streams.video[0]
            frames = [f.to_ndarray(format="rgb24") for f in container.decode(stream)]
            rate = stream.average_rate or stream.guessed_rate
    except av.error.FFmpegError as e:
        raise ValueError(f"could not decode MP4 data ({len(data)} bytes): {e}") from e
    if not frames:
        raise ValueError("MP4 video stream holds no frames")
    if not rate:
        raise ValueError("MP4 video stream has no frame rate")
    return np.stack(frames), float(rate)
