from caper.cli import main

raise SystemExit(main())
