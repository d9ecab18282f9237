"""The program of the README's examples: ``python app.py --port 8080``."""

import argparse

from myapp.main import main

parser = argparse.ArgumentParser()
parser.add_argument("--port", type=int, default=8080)
main(parser.parse_args().port)
