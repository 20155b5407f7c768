import sys

from portable_softmax.cli import main

sys.exit(main())
