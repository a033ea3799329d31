from caper.front.cli import main

raise SystemExit(main())
