import sys

from voice_context.cli import main

sys.exit(main())
