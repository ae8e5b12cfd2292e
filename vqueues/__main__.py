from vqueues.cli import main

raise SystemExit(main())
