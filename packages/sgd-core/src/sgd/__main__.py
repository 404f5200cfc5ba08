from sgd.cli import main

raise SystemExit(main())
