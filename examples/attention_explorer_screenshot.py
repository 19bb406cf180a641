"""A picture of TensorBoard's Attention tab for a trained run: the README's screenshot.

    python examples/attention_explorer_screenshot.py runs/demo docs/attention-explorer.png

Starts `tensorboard` on the run's logs (127.0.0.1, a free port:
`keras_transformer.tensorboard_plugin.server.serve`), opens the
Attention tab in headless Chromium (Debian's, driven by Playwright: nothing
is downloaded), shows the last layer's cross-attention of the first sample
with every head, points at the second source word and saves the page.
"""

import argparse
import sys
from pathlib import Path


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("run_dir")
    parser.add_argument("out", help="the PNG to write")
    parser.add_argument("--source-token", type=int, default=2, help="which source token to point at")
    arguments = parser.parse_args()
    logs = Path(arguments.run_dir) / "logs"
    if not (logs / "samples").is_dir():
        sys.exit(f"{logs / 'samples'} does not exist: train the run with --attention-samples first")

    from playwright.sync_api import sync_playwright

    from keras_transformer.tensorboard_plugin.server import serve

    with serve(logs) as url, sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path="/usr/bin/chromium", headless=True,
            args=["--no-sandbox", "--disable-gpu", "--disable-background-networking"],
        )
        page = browser.new_page(viewport={"width": 1200, "height": 600})
        page.goto(f"{url}/?darkMode=false#attention")
        frame = None
        while frame is None:
            frame = next((each for each in page.frames if "name=attention" in each.url), None)
            page.wait_for_timeout(200)
        frame.wait_for_selector("#head-view line.link")
        frame.select_option("#kind", "cross")
        frame.hover(f'#head-view .token[data-side="key"][data-index="{arguments.source_token}"]')
        page.wait_for_timeout(300)
        page.screenshot(path=arguments.out)
        browser.close()
    print(f"screenshot: {arguments.out}")


if __name__ == "__main__":
    main()
