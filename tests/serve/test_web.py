"""The page at / in headless Chromium: send a message, watch the reply stream in, watch the monitor move."""

from __future__ import annotations

import re
import shutil

import pytest

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run"]

pytestmark = pytest.mark.skipif(
    shutil.which("chromium") is None,
    reason="Debian's chromium is not installed (`apt-get install -y chromium`; .ci/run installs it on CI)")


@pytest.fixture(scope="module")
def page(server):
    sync_api = pytest.importorskip("playwright.sync_api", reason="the playwright package is not installed")
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=FLAGS, headless=True)
        page = browser.new_page()
        page.set_default_timeout(30_000)
        yield page
        browser.close()


def test_chat_streams_a_reply_and_the_monitor_counts_it(page, server):
    from playwright.sync_api import expect

    page.goto(server.url + "/")
    expect(page.locator("#model-name")).to_have_text("tiny")
    page.click("#tab-monitor")
    expect(page.locator("#m-state")).to_have_text("idle")
    before = int(page.locator("#m-generated").inner_text())

    page.click("#tab-chat")
    page.fill("#max-tokens", "12")
    page.fill("#temperature", "0")
    page.fill("#prompt", "Say something about rivers.")
    page.click("#send")
    expect(page.locator(".msg.user")).to_have_text("Say something about rivers.")
    reply = page.locator(".msg.assistant").last
    expect(reply).not_to_have_text("")
    expect(page.locator("#chat-status")).to_contain_text("generated")  # the final usage event arrived
    expect(page.locator("#send")).to_be_enabled()

    page.click("#tab-monitor")
    page.wait_for_function(f"parseInt(document.getElementById('m-generated').textContent) > {before}")
    assert page.locator("#m-decode-tps").inner_text() != "-"
    assert "iB" in page.locator("#m-rss").inner_text()
    assert page.locator("#m-hit-rate").inner_text() == "- (experts all resident)"  # the CPU model has no cache
    assert page.locator("#m-gpu").inner_text() == "- (no GPU)"
    assert re.fullmatch(r"\d+ \((-|[\d.]+ [KMG]?i?B)\)", page.locator("#m-checkpoints").inner_text())


def test_stop_button_cancels_a_long_reply(page, server):
    from playwright.sync_api import expect

    page.goto(server.url + "/")
    page.fill("#max-tokens", "3000")
    page.fill("#temperature", "0")
    page.fill("#prompt", "Hello")  # greedy on the tiny model never ends by itself
    page.click("#send")
    reply = page.locator(".msg.assistant").last
    expect(reply).not_to_have_text("")
    page.click("#tab-monitor")  # the running request's progress shows while it runs
    expect(page.locator("#m-current")).to_contain_text("generating")
    expect(page.locator("#m-state")).to_have_text("running")
    page.click("#tab-chat")
    page.click("#stop")
    expect(page.locator("#chat-status")).to_have_text("stopped")
    state = server.wait_idle(timeout=10)
    assert state["last"]["finish_reason"] == "cancelled"


def test_thinking_shows_apart_from_the_reply_and_the_switch_turns_it_off(page, scripted_server):
    from playwright.sync_api import expect

    from tests.serve.scripted_server import THOUGHT

    page.goto(scripted_server.url + "/")
    page.fill("#max-tokens", "200")
    page.check("#thinking")
    page.fill("#prompt", "Hi")
    page.click("#send")
    expect(page.locator(".msg.assistant").last).to_have_text("thinking default")
    expect(page.locator(".msg.thinking").last).to_have_text(THOUGHT)
    expect(page.locator("#send")).to_be_enabled()

    page.click("#clear")
    page.uncheck("#thinking")
    page.fill("#prompt", "Hi")
    page.click("#send")
    expect(page.locator(".msg.assistant").last).to_have_text("thinking off")
    expect(page.locator("#send")).to_be_enabled()
    assert page.locator(".msg.thinking").count() == 0
