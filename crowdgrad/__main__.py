from crowdgrad.cli import main

raise SystemExit(main())
