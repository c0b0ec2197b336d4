"""The playground page in headless Chromium: type a prompt, click Send, streamed text and tokens/s appear."""
from __future__ import annotations

import os
from pathlib import Path

import pytest


def test_playground_streams_an_answer(tiny_live, browser, tmp_path):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select, WebDriverWait

    browser.get(tiny_live.url + "/")
    assert "ortllm playground" in browser.title
    Select(browser.find_element(By.ID, "mode")).select_by_value("completion")
    mt = browser.find_element(By.ID, "max_tokens")
    mt.clear()
    mt.send_keys("48")
    browser.find_element(By.ID, "prompt").send_keys("Once upon a time")
    browser.find_element(By.ID, "send").click()
    wait = WebDriverWait(browser, 30, poll_frequency=0.1)
    wait.until(lambda d: d.find_element(By.ID, "output").text.strip() != "")
    wait.until(lambda d: d.find_element(By.ID, "send").is_enabled())           # the stream ended
    out = browser.execute_script("return document.getElementById('output').textContent")
    stats = browser.find_element(By.ID, "stats").text
    ref = tiny_live.complete("Once upon a time", max_tokens=48)
    want, n = ref["choices"][0]["text"], ref["usage"]["completion_tokens"]
    # the page shows the server's own token count (the random model may stop at its EOS before 48)
    assert "tokens/s" in stats and stats.startswith(f"{n} tokens ·") and 0 < n <= 48, stats
    assert out == want
    assert browser.find_element(By.ID, "health").text == "health: ok"
    shot = Path(os.environ.get("ORTLLM_TEST_ARTIFACTS", tmp_path)) / "playground.png"
    shot.parent.mkdir(parents=True, exist_ok=True)
    browser.save_screenshot(str(shot))
    print(f"screenshot: {shot}")
    assert shot.stat().st_size > 1000


@pytest.mark.slow
def test_playground_chat_on_smollm2(smol_live, browser, tmp_path):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    browser.get(smol_live.url + "/")
    assert browser.find_element(By.ID, "mode").get_attribute("value") == "chat"
    mt = browser.find_element(By.ID, "max_tokens")
    mt.clear()
    mt.send_keys("24")
    browser.find_element(By.ID, "prompt").send_keys("What is the capital of France?")
    browser.find_element(By.ID, "send").click()
    wait = WebDriverWait(browser, 60, poll_frequency=0.1)
    wait.until(lambda d: d.find_element(By.ID, "output").text.strip() != "")
    wait.until(lambda d: d.find_element(By.ID, "send").is_enabled())
    assert "Paris" in browser.find_element(By.ID, "output").text
    assert "tokens/s" in browser.find_element(By.ID, "stats").text
    shot = Path(os.environ.get("ORTLLM_TEST_ARTIFACTS", tmp_path)) / "playground-chat.png"
    shot.parent.mkdir(parents=True, exist_ok=True)
    browser.save_screenshot(str(shot))
