#!/usr/bin/python3
"""The simulator page in headless Chromium, driven by Selenium as a person would use it.

    /usr/bin/python3 tests/browser/simulator_page.py http://127.0.0.1:PORT/ OUT.png

tests/it/simulator_page.rs starts `simulate --serve` and runs this; scripts/test installs
what it needs from Debian (chromium, chromium-driver, python3-selenium, for the system
python3). Steps: load the page; keep only "closed" among the policies (keyboard: Space
on each checkbox); set the outage to 10 s; wait for the chart; read from the table that
acme gets 0 during the outage and 49-50/s before it, and the outage's worst 1 s holds the
normal phase's last second; switch to the local share and read
45-50/s; save a screenshot. Exits non-zero, saying what it saw, when a step fails.
"""

import sys

from selenium import webdriver
from selenium.webdriver.chrome.options import Options
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.support.ui import WebDriverWait

# Each run takes up to a few seconds in a debug build on a loaded machine.
TIMEOUT_S = 90

POLICIES = [
    "open",
    "closed",
    "local-share",
    "static",
    "static-then-local-share",
    "local-share-no-divisor",
    "local-share-stale-divisor",
    "local-share-pinned",
    "local-share-leased",
]


def browser():
    options = Options()
    options.binary_location = "/usr/bin/chromium"
    for argument in [
        "--headless=new",
        # As root (CI and scripts/test run as root) Chromium needs no sandbox to start.
        "--no-sandbox",
        "--disable-dev-shm-usage",
        "--disable-gpu",
        "--window-size=1600,1250",
        "--force-device-scale-factor=1",
    ]:
        options.add_argument(argument)
    return webdriver.Chrome(service=Service("/usr/bin/chromedriver"), options=options)


def cell(driver, phase, policy, customer):
    """The admitted rate of one table cell, or None while the table lacks it."""
    found = driver.find_elements(
        By.CSS_SELECTOR,
        f'table[data-phase="{phase}"] td[data-policy="{policy}"][data-customer="{customer}"]',
    )
    return float(found[0].text) if found else None


def settled(driver, policies, outage_secs):
    """The answer shown is for these policies and this outage, and no run is pending."""
    status = driver.find_element(By.ID, "status").text
    if not status.startswith("Done") or "running" in driver.find_element(By.TAG_NAME, "body").get_attribute("class"):
        return False
    caption = driver.find_elements(By.CSS_SELECTOR, 'table[data-phase="outage"] caption')
    if not caption or not caption[0].text.startswith(f"outage: {outage_secs} s,"):
        return False
    rows = driver.find_elements(By.CSS_SELECTOR, 'table[data-phase="outage"] tbody th')
    if [r.text for r in rows] != policies:
        return False
    panels = driver.find_elements(By.CSS_SELECTOR, "#rate-chart svg.panel")
    return len(panels) == len(policies) and all(p.find_elements(By.TAG_NAME, "polyline") for p in panels)


def check(condition, message):
    if not condition:
        print(f"FAILED: {message}", file=sys.stderr)
        sys.exit(1)
    print(f"ok: {message}")


def main():
    url, screenshot = sys.argv[1], sys.argv[2]
    driver = browser()
    try:
        wait = WebDriverWait(driver, TIMEOUT_S, poll_frequency=0.2)
        # 1. Load the page: the first run is the command line's default scenario.
        driver.get(url)
        wait.until(lambda d: settled(d, POLICIES, 30))
        check(True, "the page loaded and ran the default scenario")

        # 2. Pick "fail closed": every other policy's box unticked with the keyboard.
        for name in POLICIES:
            box = driver.find_element(By.ID, f"policy-{name}")
            if box.is_selected() != (name == "closed"):
                box.send_keys(Keys.SPACE)
        # 3. A 10 s outage.
        outage = driver.find_element(By.ID, "outage_secs")
        outage.send_keys(Keys.CONTROL, "a")
        outage.send_keys("10")
        # 4. Wait for the chart of that run.
        wait.until(lambda d: settled(d, ["closed"], 10))
        # 5. acme during the outage and before it.
        during = cell(driver, "outage", "closed", "acme")
        before = cell(driver, "normal", "closed", "acme")
        check(during == 0.0, f"failing closed, acme gets {during}/s during the outage")
        check(before is not None and 49.0 <= before <= 50.0, f"acme gets {before}/s before it")
        # The worst window's column: one count per caller, the outage's holding the normal
        # phase's last second (a window straddling the outage's start counts toward it).
        headings = [h.text for h in driver.find_elements(By.CSS_SELECTOR, 'table[data-phase="outage"] thead th')]
        check("worst 1 s" in headings, f"the outage's table has a worst 1 s column: {headings}")
        worst = driver.find_element(By.CSS_SELECTOR, 'table[data-phase="outage"] td.worst[data-policy="closed"]').text
        counts = [int(n) for n in worst.split(" / ")]
        check(len(counts) == 3 and 0 < counts[0] <= 50, f"failing closed, the outage's worst 1 s is {worst}")

        # 6. Switch to the local share.
        driver.find_element(By.ID, "policy-local-share").send_keys(Keys.SPACE)
        driver.find_element(By.ID, "policy-closed").send_keys(Keys.SPACE)
        wait.until(lambda d: settled(d, ["local-share"], 10))
        shared = cell(driver, "outage", "local-share", "acme")
        check(shared is not None and 45.0 <= shared <= 50.0, f"sharing locally, acme gets {shared}/s during the outage")
        # The single-caller view follows: acme under the local share, request by request.
        wait.until(lambda d: "acme under local-share" in d.find_element(By.ID, "trace-caption").text)
        marks = driver.find_elements(By.CSS_SELECTOR, "#trace-chart circle.admitted, #trace-chart path.limited")
        check(len(marks) > 100, f"the single-caller view marks {len(marks)} requests")
        check(not driver.find_element(By.ID, "error").is_displayed(), "no error shown")
        # Moving the view outside the traced minute fetches that stretch, then back.
        start = driver.find_element(By.ID, "trace-from")
        for second in ["0", "28"]:
            start.send_keys(Keys.CONTROL, "a")
            start.send_keys(second)
            wait.until(lambda d: f"acme under local-share, {second} to {int(second) + 5} s: 600 requests" in d.find_element(By.ID, "trace-caption").text)
        check(True, "the single-caller view moves to 0-5 s and back to 28-33 s")

        # 7. The screenshot: the whole page, from the top.
        height = driver.execute_script("return document.documentElement.scrollHeight")
        driver.set_window_size(1600, height + 140)
        driver.execute_script("window.scrollTo(0, 0)")
        check(driver.save_screenshot(screenshot), f"screenshot saved to {screenshot}")
    finally:
        driver.quit()


if __name__ == "__main__":
    main()
