import sys

from qwen3_neuron.assets.build import main

sys.exit(main())
