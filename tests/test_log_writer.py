"""The server's log lines are written by a thread of their own (``proxy.logs.LogWriter``): a
standard error that stops reading must not stop the proxy."""

from __future__ import annotations

import asyncio
import io
import json
import logging
import subprocess
import threading
import time
from pathlib import Path

import aiohttp
import pytest

from proxy.logs import JsonFormatter, LogLine, LogWriter, TextFormatter, configure_logging
from tests.fake_upstream import FakeUpstream
from tests.serving import serve_command

ROOT = Path(__file__).parent.parent


class HeldHandler(logging.Handler):
    """Collects formatted lines; ``hold`` keeps it from returning until released."""

    def __init__(self, formatter: logging.Formatter) -> None:
        super().__init__()
        self.setFormatter(formatter)
        self.lines: list[str] = []
        self.hold = threading.Event()
        self.hold.set()
        self.thread_names: set[str] = set()

    def emit(self, record: logging.LogRecord) -> None:
        self.hold.wait()
        self.thread_names.add(threading.current_thread().name)
        self.lines.append(self.format(record))


def _logger(writer: LogWriter, name: str) -> logging.Logger:
    logger = logging.getLogger(name)
    logger.handlers[:] = [writer]
    logger.propagate = False
    logger.setLevel(logging.DEBUG)
    return logger


def test_lines_are_formatted_on_the_writer_thread_with_the_text_of_the_moment():
    target = HeldHandler(JsonFormatter())
    writer = LogWriter(target)
    logger = _logger(writer, "test.log_writer.text")
    changing = ["before"]
    logger.info("value %s key sk-abcdefgh12345678", changing, extra={"fields": {"n": 1}})
    changing[0] = "after"  # the line says what it was when logged
    try:
        raise ValueError("boom")
    except ValueError:
        logger.exception("failed")
    writer.close()
    first, second = (json.loads(line) for line in target.lines)
    assert first["message"] == "value ['before'] key <redacted>" and first["n"] == 1
    assert second["message"] == "failed"
    assert "ValueError: boom" in second["exception"] and "Traceback" in second["exception"]
    assert target.thread_names == {"deepmem-log"}


def test_a_stuck_output_drops_lines_and_says_how_many_instead_of_blocking():
    target = HeldHandler(TextFormatter())
    target.hold.clear()  # the output stops taking lines
    writer = LogWriter(target, capacity=3)
    logger = _logger(writer, "test.log_writer.full")
    started = time.perf_counter()
    for number in range(20):
        logger.warning("line %d", number)
    assert time.perf_counter() - started < 1.0  # no call waited for the output
    target.hold.set()
    while writer.waiting:
        time.sleep(0.01)
    logger.warning("after")
    writer.close()
    dropped = [line for line in target.lines if "dropped" in line]
    written = [line for line in target.lines if "dropped" not in line]
    assert dropped  # (more than one when the writer took a line while the loop logged)
    counted = sum(int(line.split("deepmem: ")[1].split(" ")[0]) for line in dropped)
    assert counted + len(written) == 21  # every line is written or counted
    assert written[-1].endswith("after")


def test_lines_are_written_in_batches_and_all_of_them_on_close():
    """A line does not wake the writer by itself: it waits for the lines after it (here for
    longer than the test runs), and closing writes every waiting line at once, in order."""
    target = HeldHandler(TextFormatter())
    writer = LogWriter(target, batch_seconds=60.0)
    logger = _logger(writer, "test.log_writer.batch")
    for number in range(3):
        logger.info("line %d", number)
    time.sleep(0.2)
    assert target.lines == [] and writer.waiting == 3
    started = time.perf_counter()
    writer.close()
    assert time.perf_counter() - started < 5.0
    assert [line.rsplit(" ", 1)[-1] for line in target.lines] == ["0", "1", "2"]


def test_configure_logging_replaces_the_previous_writer():
    stream = io.StringIO()
    first = configure_logging("info", "text", stream)
    second = configure_logging("info", "text", stream)
    try:
        assert logging.getLogger().handlers == [second]
        assert not first._thread.is_alive()
        logging.getLogger("deepmem").info("hello")
    finally:
        logging.getLogger().removeHandler(second)
        second.close()
    assert stream.getvalue().rstrip().endswith("deepmem: hello")


@pytest.mark.slow
async def test_a_standard_error_nobody_reads_does_not_stall_requests(
    tmp_path: Path, unused_tcp_port: int, upstream: FakeUpstream
) -> None:
    """Regression: each line was written on the event loop, so once the pipe's buffer was
    full (64 KiB on Linux) the next write blocked the loop, and every request with it."""
    command = serve_command(
        unused_tcp_port,
        tmp_path / "data",
        "--upstream",
        f"{upstream.url}/v1",
        "--log-level",
        "debug",
        "--log-bodies",
    )
    served = subprocess.Popen(command, stderr=subprocess.PIPE, cwd=ROOT)
    base = f"http://127.0.0.1:{unused_tcp_port}"
    timeout = aiohttp.ClientTimeout(total=20)
    try:
        async with aiohttp.ClientSession(timeout=timeout) as client:
            for _ in range(200):
                try:
                    async with client.get(base + "/health") as response:
                        if response.status in (200, 503):
                            break
                except aiohttp.ClientError:
                    pass
                await asyncio.sleep(0.05)
            text = "x" * 6000  # each request logs about 4 KiB of its body
            for number in range(40):  # about 200 KiB of log lines, none of them read
                body = {"model": "m", "messages": [{"role": "user", "content": f"{number}{text}"}]}
                async with client.post(base + "/v1/chat/completions", json=body) as response:
                    assert response.status == 200
                    await response.read()
    finally:
        served.terminate()
        _, stderr = await asyncio.to_thread(served.communicate, timeout=30)
    lines = stderr.decode().splitlines()
    assert any("listening on" in line for line in lines)
    assert sum("deepmem.access: request" in line for line in lines) == 40
    assert "deepmem stopped" in lines[-1]  # every line waiting was written before the exit


def test_a_line_written_later_carries_the_time_it_was_made(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A request's access line is made as its answer goes out and written when the request is
    counted, on the bookkeeping thread: its time is the first one."""
    logger = logging.getLogger("deepmem.test-later")
    made = 1_790_000_000.25  # a quarter of a second: the milliseconds are exact
    line = LogLine("request", {"status": 200}, made)
    with caplog.at_level(logging.INFO, logger=logger.name):
        line.write(logger)
    [record] = caplog.records
    assert record.created == made and record.fields == {"status": 200}  # type: ignore[attr-defined]
    stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(made))
    assert TextFormatter().format(record).startswith(f"{stamp},250 ")
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(made))
    assert f'"ts": "{stamp}.250Z"' in JsonFormatter().format(record)
    with caplog.at_level(logging.WARNING, logger=logger.name):
        line.write(logger)  # below the logger's level: nothing
    assert len(caplog.records) == 1
